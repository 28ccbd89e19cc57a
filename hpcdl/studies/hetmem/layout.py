"""An application's data as pages and ranges, and placements of them onto the two memory tiers.

A placement is a boolean mask over the application's pages (True = fast tier). It is built from
named objects (whole objects in fast memory) and/or byte-address ranges; a name that is no object
or a range that lies outside every object is a PlacementError, never a silent empty placement.
Ranges (the agent's and the random placements' unit) are runs of `range_pages` pages that never
cross an object boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcdl.studies.hetmem.trace import Obj

PAGE = 4096


class PlacementError(ValueError):
    """A placement that names an unknown object or an address range outside every object."""


@dataclass(frozen=True)
class Range:
    obj: str
    first_page: int  # page index within the object
    pages: int
    start: int  # global page index of the first page

    @property
    def label(self) -> str:
        return f"{self.obj}[{self.first_page}:{self.first_page + self.pages}]"


class Layout:
    def __init__(self, objects: list[Obj]):
        self.objects = sorted(objects, key=lambda o: o.base)
        self.names = [o.name for o in self.objects]
        self.pages_of = np.array([-(-o.size // PAGE) for o in self.objects], dtype=np.int64)
        self.first_page = np.concatenate([[0], np.cumsum(self.pages_of)[:-1]]).astype(np.int64)
        self.n_pages = int(self.pages_of.sum())
        self._bases = np.array([o.base for o in self.objects], dtype=np.int64)
        self._ends = self._bases + np.array([o.size for o in self.objects], dtype=np.int64)

    @property
    def footprint_bytes(self) -> int:
        return self.n_pages * PAGE

    def page_index(self, addr: np.ndarray) -> np.ndarray:
        """Global page index of each address; -1 for an address outside every object."""
        addr = np.asarray(addr, dtype=np.int64)
        i = np.searchsorted(self._bases, addr, side="right") - 1
        ok = (i >= 0) & (addr < self._ends[np.clip(i, 0, None)])
        i = np.clip(i, 0, None)
        page = self.first_page[i] + (addr - self._bases[i]) // PAGE
        return np.where(ok, page, -1)

    def object_pages(self, name: str) -> slice:
        if name not in self.names:
            raise PlacementError(
                f"placement names unknown object {name!r}; objects of this app: {', '.join(self.names)}"
            )
        k = self.names.index(name)
        return slice(int(self.first_page[k]), int(self.first_page[k] + self.pages_of[k]))

    def mask(self, fast_objects=(), fast_ranges=()) -> np.ndarray:
        """Page mask of a placement: whole objects and [lo, hi) byte-address ranges in fast memory."""
        m = np.zeros(self.n_pages, dtype=bool)
        for name in fast_objects:
            m[self.object_pages(name)] = True
        for lo, hi in fast_ranges:
            if hi <= lo:
                raise PlacementError(f"address range [{lo:#x}, {hi:#x}) is empty")
            pages = self.page_index(np.arange(lo - lo % PAGE, hi, PAGE))
            pages = pages[pages >= 0]
            if len(pages) == 0:
                raise PlacementError(
                    f"address range [{lo:#x}, {hi:#x}) lies outside every object "
                    f"({', '.join(f'{o.name}=[{o.base:#x}, {o.base + o.size:#x})' for o in self.objects)})"
                )
            m[pages] = True
        return m

    def ranges(self, range_pages: int) -> list[Range]:
        out = []
        for k, o in enumerate(self.objects):
            for first in range(0, int(self.pages_of[k]), range_pages):
                n = min(range_pages, int(self.pages_of[k]) - first)
                out.append(Range(o.name, first, n, int(self.first_page[k]) + first))
        return out

    def ranges_mask(self, ranges: list[Range], chosen) -> np.ndarray:
        m = np.zeros(self.n_pages, dtype=bool)
        for r, on in zip(ranges, chosen, strict=True):
            if on:
                m[r.start : r.start + r.pages] = True
        return m


def range_pages_for(layout: Layout, n_ranges: int) -> int:
    """Pages per range so that the footprint splits into about n_ranges ranges."""
    return max(1, -(-layout.n_pages // n_ranges))


def describe(layout: Layout, mask: np.ndarray) -> str:
    """A placement in words: objects wholly fast by name, partly fast as 'name k/n pages'."""
    parts = []
    for k, name in enumerate(layout.names):
        sl = slice(int(layout.first_page[k]), int(layout.first_page[k] + layout.pages_of[k]))
        n = int(mask[sl].sum())
        if n == layout.pages_of[k]:
            parts.append(name)
        elif n:
            parts.append(f"{name} {n}/{int(layout.pages_of[k])}p")
    return " ".join(parts) if parts else "(none)"
