"""Fixed glibc heap thresholds for in-process timing comparisons.

glibc serves blocks at or above its mmap threshold with fresh mappings (page faults and zeroing on
every allocation), and by default the threshold moves with the sizes freed so far. Two identical
computations timed one after the other can then differ by the faults alone: one gets its
temporaries from the heap, the next from new pages. Fixing the thresholds (as
hpcdl.platform.kit.rank_runtime.launch.RANK_MALLOC_ENV does for ranks at start-up) makes every timed call
allocate alike.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)


def fix_heap_thresholds(mmap_bytes: int = MMAP_THRESHOLD_MAX, trim_bytes: int = 1 << 30) -> bool:
    """Blocks below `mmap_bytes` come from the heap, which keeps `trim_bytes` of free top before
    returning memory; setting them turns glibc's moving threshold off. False where libc has no
    mallopt (not glibc): nothing changes there."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    mmap_ok = bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_bytes))
    return mmap_ok and bool(libc.mallopt(M_TRIM_THRESHOLD, trim_bytes))
