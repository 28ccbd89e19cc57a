"""The async snapshot's CPU copy (hpcdl/studies/checkpoint/host_copy.py): every byte lands, whatever
the dtype, size or layout; errors surface; the Snapshot uses it for CPU state. Its timing beside a
busy core is a benchmark (benchmarks/snapshot_copy.py), not a test."""

from __future__ import annotations

import pytest
import torch

from hpcdl.studies.checkpoint import host_copy, saver


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    big = host_copy.CHUNK_BYTES // 4 * 3 + 17  # three chunks and a ragged tail
    return {"fp32": torch.randn(big, generator=g),
            "bf16": torch.randn(1000, 3, generator=g).to(torch.bfloat16),
            "int64": torch.randint(-2**40, 2**40, (513,), generator=g),
            "bool": torch.rand(77, generator=g) > 0.5,
            "empty": torch.zeros(0, 4),
            "strided": torch.randn(64, 64, generator=g).t(),  # not contiguous: torch copies it
            "scalar": torch.tensor(3.5)}


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_queued_copy_writes_every_byte_of_every_tensor(threads):
    src = _state()
    dst = {k: torch.full_like(t, 0) for k, t in src.items()}
    copy = host_copy.QueuedCopy(threads)
    try:
        copy(dst, src)
    finally:
        copy.close()
    for k, t in src.items():
        assert dst[k].dtype == t.dtype and torch.equal(dst[k], t), k


def test_queued_copy_refuses_no_threads_and_surfaces_a_workers_error():
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        host_copy.QueuedCopy(0)
    copy = host_copy.QueuedCopy(2)
    try:
        src = {"w": torch.ones(host_copy.CHUNK_BYTES // 2)}  # 2 chunks
        short = {"w": torch.zeros(host_copy.CHUNK_BYTES // 8)}  # a buffer of the wrong size
        with pytest.raises(ValueError):
            copy(short, src)
    finally:
        copy.close()


def test_cpu_snapshot_takes_through_the_queued_copy_and_reuses_its_buffers():
    src = _state()
    snap = saver.Snapshot()
    first = snap.take(src)
    assert all(torch.equal(first[k], t) for k, t in src.items())
    assert isinstance(snap._host_copy, host_copy.QueuedCopy)
    assert snap._host_copy.threads == torch.get_num_threads()
    ptrs = {k: b.data_ptr() for k, b in first.items()}
    src["fp32"].add_(1.0)  # training moves on; the next snapshot copies the new values
    second = snap.take(src)
    assert {k: b.data_ptr() for k, b in second.items()} == ptrs
    assert torch.equal(second["fp32"], src["fp32"]) and snap.copy_s > 0
