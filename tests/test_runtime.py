"""The local PyCOMPSs backend: real worker processes, real overlap, each failure mode."""

import pytest
import runtime_tasks as rt

from hpcdl.platform.orchestration.task_runtime import (
    compss_barrier,
    compss_wait_on,
    failure_reason,
    set_local_cores,
)
from hpcdl.platform.orchestration.task_runtime.local_futures import LocalFuture, TaskFailedError
from hpcdl.platform.orchestration.task_runtime.units import resolve


@pytest.fixture(autouse=True)
def two_cores():
    set_local_cores(2)
    yield
    set_local_cores(None)


def overlap(a, b):
    return min(a["end"], b["end"]) - max(a["start"], b["start"])


def test_two_one_unit_tasks_overlap_on_two_cores():
    # Warm both workers first so process start-up does not serialise the measured pair.
    compss_wait_on([rt.sleep_one(0.01), rt.sleep_one(0.01)])
    a, b = compss_wait_on([rt.sleep_one(1.5), rt.sleep_one(1.5)])
    assert a["pid"] != b["pid"]
    assert overlap(a, b) > 0.5, (a, b)


def test_two_unit_task_runs_alone():
    compss_wait_on([rt.sleep_one(0.01), rt.sleep_one(0.01)])
    big = rt.sleep_two(1.0)
    small = [rt.sleep_one(0.5), rt.sleep_one(0.5)]
    big, small = compss_wait_on(big), compss_wait_on(small)
    for s in small:
        assert overlap(big, s) <= 0, (big, s)


def test_wait_on_resolves_nested_structures_and_dependencies():
    x = rt.add(1, 2)
    y = rt.add(x, 10)  # depends on x's future
    first, second = rt.pair(4)
    out = compss_wait_on({"x": x, "list": [y, (first, second)], "plain": 7})
    assert out == {"x": 3, "list": [13, (4, 40)], "plain": 7}


def test_ignore_gives_default_and_records_reason():
    futs = [rt.fail_ignored(3), rt.add(1, 1)]
    values = compss_wait_on(futs)
    assert values == [-1, 2]
    assert "ValueError: bad point 3" in failure_reason(futs[0])
    assert failure_reason(futs[1]) is None


def test_fail_raises_at_wait_and_fails_dependents():
    bad = rt.fail_hard(7)
    dependent = rt.add(bad, 1)
    with pytest.raises(TaskFailedError, match="hard failure 7"):
        compss_wait_on(bad)
    with pytest.raises(TaskFailedError, match="dependency failed"):
        compss_wait_on(dependent)


def test_retry_runs_once_more(tmp_path):
    assert compss_wait_on(rt.fail_first_time(str(tmp_path / "marker"))) == "second attempt"
    with pytest.raises(TaskFailedError, match="permanent failure"):
        compss_wait_on(rt.always_fails())


def test_default_on_failure_is_retry_as_in_pycompss(tmp_path):
    assert compss_wait_on(rt.fail_first_time_no_decorator(str(tmp_path / "marker"))) == "second attempt"


def test_on_failure_management_is_mandatory_as_in_pycompss():
    from hpcdl.platform.orchestration.task_runtime.local import on_failure

    with pytest.raises(TypeError, match="management"):
        on_failure(returns=None)


def test_units_from_environment_set_torch_threads(monkeypatch):
    monkeypatch.setenv("HPCDL_TEST_UNITS", "2")
    assert compss_wait_on(rt.units_from_env()) == 2


def test_barrier_waits_for_everything():
    futs = [rt.sleep_one(0.3) for _ in range(3)]
    compss_barrier()
    assert all(f.done() for f in futs)


def test_bad_units_are_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="'two' is not a core count"):
        resolve("two", "task t")
    with pytest.raises(ValueError, match="'0' is not a core count"):
        resolve("0", "task t")
    monkeypatch.delenv("HPCDL_NOT_SET", raising=False)
    with pytest.raises(ValueError, match="HPCDL_NOT_SET, which is not set"):
        resolve("${HPCDL_NOT_SET}", "task t")


def test_returns_a_future_not_a_value():
    fut = rt.noop()
    assert isinstance(fut, LocalFuture)
    assert compss_wait_on(fut) is None
