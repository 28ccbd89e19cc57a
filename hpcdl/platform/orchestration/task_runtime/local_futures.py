"""The local backend's futures: what a task call returns, and how nested arguments are resolved."""

from __future__ import annotations

import itertools
import threading


class TaskFailedError(RuntimeError):
    """A task failed under FAIL, or twice under RETRY (the default), or depended on one that did."""


class LocalFuture:
    """The placeholder a task call returns; compss_wait_on turns it into the value."""

    _ids = itertools.count(1)

    def __init__(self, name: str):
        self.id = next(self._ids)
        self.name = name
        self._done = threading.Event()
        self._value = None
        self._error: str | None = None
        self.failure: str | None = None  # set when IGNORE swallowed an exception

    def _set(self, value=None, error: str | None = None):
        self._value, self._error = value, error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self):
        self._done.wait()
        if self._error is not None:
            raise TaskFailedError(f"task {self.name} (#{self.id}) failed:\n{self._error}")
        return self._value

    def __repr__(self):
        return f"<LocalFuture #{self.id} {self.name} {'done' if self.done() else 'pending'}>"


class ItemFuture(LocalFuture):
    """One element of a task declared with returns=N > 1."""

    def __init__(self, parent: LocalFuture, index: int):
        self.parent, self.index = parent, index
        self.id, self.name = parent.id, f"{parent.name}[{index}]"

    def done(self):
        return self.parent.done()

    @property
    def failure(self):
        return self.parent.failure

    def result(self):
        value = self.parent.result()
        return None if value is None else value[self.index]


def iter_futures(obj):
    """Every LocalFuture inside lists/tuples/sets/dicts (a task's dependencies)."""
    if isinstance(obj, LocalFuture):
        yield obj
    elif isinstance(obj, (list, tuple, set)):
        for item in obj:
            yield from iter_futures(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from iter_futures(item)


def resolve(obj):
    """Replace every LocalFuture inside lists/tuples/dicts by its value (blocking)."""
    if isinstance(obj, LocalFuture):
        return obj.result()
    if isinstance(obj, list):
        return [resolve(x) for x in obj]
    if isinstance(obj, tuple):
        return tuple(resolve(x) for x in obj)
    if isinstance(obj, dict):
        return {k: resolve(v) for k, v in obj.items()}
    return obj
