"""The point store (hpcdl.platform.kit.points): keys, records written by the task body, reuse, retries,
summary.

The main program here is a StudyRun whose "tasks" run inline (submit calls the body, wait returns
the values), so every test exercises the real store on real files; tests/test_points_resume.py
kills real task apps.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hpcdl.platform.kit import points
from hpcdl.platform.kit.config import load_config
from hpcdl.platform.kit.points import StudyRun, failed_row, point_key, read_record
from hpcdl.studies.spatial import sweep as spatial_sweep


class Future:
    """What an inline 'task' hands back: its value, or None with a reason (on_failure IGNORE)."""

    def __init__(self, value=None, reason=None):
        self.value, self.reason = value, reason


def _body(x: int, fail: bool = False) -> dict:
    if fail:
        raise ValueError(f"point {x} is bad")
    return {"x": x, "sq": x * x, "f": np.float32(0.5) * x}


def _sweep(run: StudyRun, pts: list[dict], calls: list, fail=(), task="sq") -> list:
    def submit(p, slot):
        calls.append(p["x"])
        try:
            return Future(slot.run(_body, p["x"], p["x"] in fail))
        except ValueError as exc:
            return Future(None, f"{type(exc).__name__}: {exc}")

    batch = run.submit(task, pts, submit)
    (out,) = run.gather([batch], lambda futs: [f.value for f in futs], lambda f: f.reason)
    return out


@pytest.fixture
def cfg(tmp_path):
    return {"results_dir": str(tmp_path / "results")}


def test_key_ignores_order_and_timeouts_but_not_parameters():
    base = point_key("s", "t", {"a": 1, "b": {"c": [1, 2], "run_timeout_s": 10}, "timeout_s": 5})
    assert base == point_key("s", "t", {"b": {"run_timeout_s": 99, "c": [1, 2]}, "a": 1})
    assert base != point_key("s", "t", {"a": 2, "b": {"c": [1, 2]}})
    assert base != point_key("s", "t", {"a": 1, "b": {"c": [2, 1]}})
    assert base != point_key("s", "other", {"a": 1, "b": {"c": [1, 2]}})
    assert base != point_key("other", "t", {"a": 1, "b": {"c": [1, 2]}})


def test_body_writes_the_record_and_a_rerun_runs_nothing(cfg, tmp_path):
    pts = [{"x": i} for i in range(3)]
    first_calls, second_calls = [], []
    first_run = StudyRun(cfg, "toy")
    first = _sweep(first_run, pts, first_calls)
    assert first_calls == [0, 1, 2] and all(o.ok and not o.reused for o in first)
    assert first[1].result == {"x": 1, "sq": 1, "f": 0.5}  # as it reads back from JSON
    root = tmp_path / "results" / "toy" / "points"
    rec = read_record(root, point_key("toy", "sq", pts[1]))
    assert rec["status"] == "ok" and rec["session"] == first_run.session and rec["inputs"] == pts[1]
    assert not list(root.glob(".*.tmp"))  # temp files renamed into place

    again = StudyRun(cfg, "toy")
    again.session = first_run.session + "-2"  # same second, same pid: keep the sessions apart
    second = _sweep(again, pts, second_calls)
    assert second_calls == []
    assert [o.result for o in second] == [o.result for o in first] and all(o.reused for o in second)
    assert again.summary() == {"ok": 0, "failed": 0, "skipped": 3, "total": 3}
    assert points.executions(root) == {point_key("toy", "sq", p): [first_run.session] for p in pts}


def test_changed_parameter_recomputes_only_that_point(cfg):
    calls = []
    _sweep(StudyRun(cfg, "toy"), [{"x": 1}, {"x": 2}], calls)
    calls.clear()
    out = _sweep(StudyRun(cfg, "toy"), [{"x": 1}, {"x": 3}, {"x": 2}], calls)
    assert calls == [3]
    assert [o.reused for o in out] == [True, False, True]


def test_failed_point_is_stored_then_retried_or_kept(cfg, tmp_path, monkeypatch):
    pts = [{"x": 1}, {"x": 2}]
    calls = []
    run = StudyRun(cfg, "toy")
    out = _sweep(run, pts, calls, fail={2})
    assert [o.ok for o in out] == [True, False]
    assert out[1].error == "ValueError: point 2 is bad"  # the body's own record, not the runtime's
    rec = read_record(tmp_path / "results" / "toy" / "points", point_key("toy", "sq", pts[1]))
    assert rec["status"] == "failed" and "Traceback" in rec["traceback"]
    assert run.summary() == {"ok": 1, "failed": 1, "skipped": 0, "total": 2}

    monkeypatch.setenv(points.KEEP_FAILED_ENV, "1")
    calls.clear()
    kept = StudyRun(cfg, "toy")
    out = _sweep(kept, pts, calls, fail={2})
    assert calls == [] and out[1].reused and out[1].error == "ValueError: point 2 is bad"
    assert kept.summary() == {"ok": 0, "failed": 1, "skipped": 1, "total": 2}

    monkeypatch.delenv(points.KEEP_FAILED_ENV)
    calls.clear()
    retry = StudyRun(cfg, "toy")
    out = _sweep(retry, pts, calls)  # the cause is gone: it succeeds now
    assert calls == [2] and all(o.ok for o in out)
    assert retry.summary() == {"ok": 1, "failed": 0, "skipped": 1, "total": 2}


def test_bad_keep_failed_value_names_the_variable(cfg, monkeypatch):
    monkeypatch.setenv(points.KEEP_FAILED_ENV, "maybe")
    with pytest.raises(ValueError, match=points.KEEP_FAILED_ENV):
        StudyRun(cfg, "toy")


def test_worker_death_is_stored_by_the_main_program(cfg, tmp_path):
    run = StudyRun(cfg, "toy")
    batch = run.submit("sq", [{"x": 5}], lambda p, slot: Future(None, "BrokenProcessPool: worker died"))
    (out,) = run.gather([batch], lambda futs: [f.value for f in futs], lambda f: f.reason)
    assert out[0].error == "BrokenProcessPool: worker died"
    rec = read_record(tmp_path / "results" / "toy" / "points", point_key("toy", "sq", {"x": 5}))
    assert rec["status"] == "failed" and rec["error"] == "BrokenProcessPool: worker died"


def test_result_that_is_not_plain_data_fails_naming_its_type(cfg, tmp_path):
    torch = pytest.importorskip("torch")
    run = StudyRun(cfg, "toy")
    slot = run.plan("t", [{"x": 1}]).entries[0].slot
    with pytest.raises(TypeError, match="torch.Tensor"):
        slot.run(lambda: {"w": torch.zeros(2)})
    assert read_record(slot.root, slot.key)["error"].startswith("TypeError: a point record holds plain data")


def test_unreadable_record_is_rerun(cfg, tmp_path, capsys):
    calls = []
    _sweep(StudyRun(cfg, "toy"), [{"x": 1}], calls)
    path = tmp_path / "results" / "toy" / "points" / f"{point_key('toy', 'sq', {'x': 1})}.json"
    path.write_text('{"key": ')
    calls.clear()
    out = _sweep(StudyRun(cfg, "toy"), [{"x": 1}], calls)
    assert calls == [1] and out[0].ok
    assert f"ignoring unreadable record {path}" in capsys.readouterr().err


def test_interrupted_point_is_reported_and_rerun(cfg, tmp_path, capsys):
    first = StudyRun(cfg, "toy")
    slot = first.plan("sq", [{"x": 1}]).entries[0].slot
    (tmp_path / "results" / "toy" / "points" / "started" / first.session).mkdir(parents=True)
    (tmp_path / "results" / "toy" / "points" / "started" / first.session / slot.key).touch()
    calls = []
    run = StudyRun(cfg, "toy")
    run.session += "-2"
    _sweep(run, [{"x": 1}], calls)
    assert calls == [1]
    assert "1 to run (1 interrupted in an earlier run)" in capsys.readouterr().err


def test_run_summary_has_exactly_the_report_keys(cfg, tmp_path):
    run = StudyRun(cfg, "toy")
    _sweep(run, [{"x": 1}, {"x": 2}], [], fail={2})
    path = run.write_summary()
    assert path == tmp_path / "results" / "toy" / "raw" / "run_summary.json"
    assert json.loads(path.read_text()) == {"ok": 1, "failed": 1, "skipped": 0, "total": 2}
    with pytest.raises(ValueError, match="does not add up"):
        run.write_summary({"ok": 1, "failed": 0, "skipped": 0, "total": 3})


def test_failed_row_keeps_the_head_and_tail_of_a_long_error():
    assert failed_row({"p": 1}, "E: short") == {"p": 1, "status": "failed", "error": "E: short"}
    assert failed_row({"p": 1}, None)["error"] == "task failed without a reason"
    long = "RankFailure: 2 ranks\n" + "x" * 5000 + "\nrank 1: KeyError: 'w'"
    row = failed_row({}, long)
    assert row["error"].startswith("RankFailure: 2 ranks") and row["error"].endswith("rank 1: KeyError: 'w'")
    assert len(row["error"]) <= points.ERROR_TAIL + 10


def test_spatial_units_are_keyed_by_what_they_read_only(write_config):
    block = load_config(write_config())["spatial"]  # with the schema's defaults
    changed = {**block, "strong": {**block["strong"], "layouts": [[1, 1, 1]]}, "repeats": 3, "warmup": 2,
               "extrapolate": {}, "exactness": {**block["exactness"], "layouts": []}}
    for unit in (spatial_sweep.run_block, spatial_sweep.calibration_block, spatial_sweep.exactness_block):
        assert unit({**changed, "warmup": block["warmup"]}) == unit(block), unit.__name__
    for unit in (spatial_sweep.calibration_block, spatial_sweep.exactness_block):
        assert unit(changed) == unit(block), unit.__name__
    assert spatial_sweep.run_block({**block, "lr": 0.5}) != spatial_sweep.run_block(block)
    # a run reads the warm-up: a paired ceiling starts alternating with its strong run after it (#59)
    assert spatial_sweep.run_block({**block, "warmup": 2}) != spatial_sweep.run_block(block)
    assert spatial_sweep.calibration_block({**block, "weak": {"grid": 4, "layouts": []}}) != \
        spatial_sweep.calibration_block(block)
