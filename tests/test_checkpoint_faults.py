"""Checkpoint study: bad configuration, a save killed mid-way, and the task app end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pandas as pd
import pytest
import torch

from hpcdl.platform.kit.config import ConfigError, load_config
from hpcdl.studies.checkpoint import integrity, saver
from hpcdl.studies.checkpoint.formats import FORMATS

# Saves a small checkpoint, then a 64 MiB one that stops at a known point of the commit and
# says so; the parent kills it there. "payload": every payload file written, nothing fsync'd,
# no manifest. "manifest": manifest written and fsync'd, staging directory not yet renamed.
KILLED_CHILD = """
import os, signal, sys, torch
from pathlib import Path
from hpcdl.studies.checkpoint import integrity, saver
root, fmt, stop = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

def halt(where):
    print(f"stopped at {where}", flush=True)
    signal.pause()                      # until the parent's SIGKILL

durable, rename = integrity.make_durable, os.rename
if stop == "payload":
    integrity.make_durable = lambda tmp: halt("payload") if "step-000000002" in tmp.name else durable(tmp)
else:
    def renaming(src, dst, *a, **k):
        if Path(dst).name == "step-000000002" and Path(src).name.startswith(".step-000000002"):
            halt("manifest")
        return rename(src, dst, *a, **k)
    os.rename = renaming
saver.save({"w": torch.full((1024,), 1.0)}, root, "step-000000001", fmt)
print("first committed", flush=True)
saver.save({f"w{i}": torch.full((1 << 20,), 2.0) for i in range(16)}, root, "step-000000002", fmt)
print("second committed", flush=True)
"""


def _staged(root) -> list:
    return list(root.glob(f".step-000000002{integrity.TMP_MARK}*"))


def _staged_bytes(root) -> int:
    return sum(p.stat().st_size for d in _staged(root) for p in d.rglob("*") if p.is_file())


@pytest.mark.parametrize("stop", ["payload", "manifest"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_sigkill_mid_save_keeps_previous_checkpoint(tmp_path, repo, fmt, stop):
    root = tmp_path / "ckpts"
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(root), fmt, stop], cwd=repo,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(300, child.kill)  # hang guard only: a stuck child ends the readline below
    guard.start()
    try:
        assert child.stdout.readline().strip() == "first committed", child.stderr.read()[-3000:]
        assert child.stdout.readline().strip() == f"stopped at {stop}", child.stderr.read()[-3000:]
        os.kill(child.pid, signal.SIGKILL)  # the second save is at the known point, and stays there
    finally:
        guard.cancel()
        if child.poll() is None:
            child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    staged = _staged(root)
    assert len(staged) == 1 and _staged_bytes(root) >= 64 << 20  # the whole payload is on disk ...
    assert (staged[0] / integrity.MANIFEST).exists() == (stop == "manifest")
    assert integrity.committed(root) == [root / "step-000000001"]  # ... and is not taken for a checkpoint
    assert not (root / "step-000000002").exists()
    back = saver.load(integrity.latest(root))  # previous checkpoint: loadable and verified
    assert torch.equal(back["w"], torch.full((1024,), 1.0))


def _block(test_config, **over) -> dict:
    return {**test_config["checkpoint"], **over}


@pytest.mark.parametrize("override,key", [
    ({"formats": ["torch", "zip"]}, "checkpoint.formats[1]"),
    ({"sizes": {"min_params": -4096, "max_params": 65536, "points": 2}}, "checkpoint.sizes.min_params"),
    ({"sizes": {"min_params": 4096, "max_params": 2**40, "points": 2}}, "checkpoint.sizes.max_params"),
    ({"sizes": {"min_params": 65536, "max_params": 4096, "points": 2}}, "checkpoint.sizes.min_params"),
    ({"scratch_dir": "../../elsewhere"}, "checkpoint.scratch_dir"),
    ({"scratch_dir": "/tmp/checkpoints"}, "checkpoint.scratch_dir"),
    ({"repeats": 0}, "checkpoint.repeats"),
    ({"overhead": {"intervals": [1, 99], "steps": 4}}, "checkpoint.overhead.intervals"),
])
def test_bad_config_names_the_key_and_writes_nothing(tmp_path, write_config, test_config, override, key,
                                                     capsys):
    path = write_config(studies=["checkpoint"], checkpoint=_block(test_config, **override))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"config key '{key}'")
    from tasks import checkpoint as app

    with pytest.raises(SystemExit) as exit_:
        app.main(["--config", str(path)])
    assert exit_.value.code == 2
    assert f"config key '{key}'" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_task_app_end_to_end_with_a_failing_point(tmp_path, write_config, test_config):
    """Tiny sweep where the larger size exceeds the scratch budget: those points fail, the rest runs."""
    block = _block(test_config, sizes={"min_params": 4096, "max_params": 262144, "points": 2},
                   scratch_limit_mb=2, dcp_ranks=[2])
    path = write_config(studies=["checkpoint"], checkpoint=block)
    from hpcdl.platform.orchestration.cli import main as cli
    from tasks import checkpoint as app

    app.main(["--config", str(path)])
    for stage in ("tables", "figures", "claims"):
        assert cli(["checkpoint", stage, "--config", str(path)]) == 0
    out = tmp_path / "results" / "checkpoint"
    io = pd.read_csv(out / "raw" / "io.csv")
    big, small = io[io["n_params"] == 262144], io[io["n_params"] == 4096]
    assert len(big) == 5 * 2 + 1 and (big["status"] == "failed").all()
    assert big["error"].str.contains("checkpoint.scratch_limit_mb").all()
    assert (small["status"] == "ok").all() and len(small) == 5 * 2 + 1
    assert small["roundtrip_ok"].all()
    assert set(small.loc[small["process_group"], "ranks"]) == {2}
    # resolved once by the app (auto: no GPU here) and named by every row, failed ones included
    assert set(io["device"]) == {"cpu"}
    assert set(small.loc[small["process_group"], "placement"]) == {"cpu (gloo)"}
    assert set(small.loc[~small["process_group"] & (small["mode"] == "sync"), "ceiling"]) == \
        {"storage (write+fsync)"}
    assert not (out.parent / "checkpoint" / "scratch").exists()  # scratch removed

    failures = pd.read_csv(out / "tables" / "failures.csv")
    assert len(failures) == 11 and (failures["kind"] == "io").all()
    resume = pd.read_csv(out / "tables" / "resume.csv")
    assert sorted(resume["format"]) == sorted(FORMATS) and resume["bit_identical"].all()
    assert set(resume["device"]) == {"cpu"} and set(resume["resumed_on"]) == {"cpu"}
    cost = pd.read_csv(out / "tables" / "io_cost.csv")
    assert set(cost["device"]) == {"cpu"}
    async_rows = cost[cost["mode"] == "async"]
    assert (async_rows["snapshot_s"] <= async_rows["blocking_s"]).all()
    assert (async_rows["persist_s"] > 0).all()
    assert (async_rows["blocking_over_sync"] > 0).all()
    ovh = pd.read_csv(out / "tables" / "overhead.csv")
    assert set(ovh["mode"]) == {"sync", "async"} and (ovh["status"] == "ok").all()
    assert len(ovh) == 2 * len(block["overhead"]["intervals"])
    yd = pd.read_csv(out / "tables" / "young_daly.csv")
    assert len(yd) == 2 * len(block["overhead"]["mtbf_s"])
    for fig in ("save_load_time", "bandwidth", "blocking", "overhead", "bytes_on_disk", "dcp_ranks"):
        assert (out / "figures" / f"{fig}.png").stat().st_size > 5000, fig
    claims = json.loads((out / "claims.json").read_text())
    by_id = {c["id"]: c for c in claims["claims"]}
    assert set(by_id) == {"async_blocking", "bandwidth_vs_ceiling", "resume_bit_identical", "roundtrip"}
    assert by_id["resume_bit_identical"]["passed"]
    for cid in ("async_blocking", "bandwidth_vs_ceiling"):  # thresholds set for the CPU say where they hold
        assert by_id[cid]["statement"].endswith("on the CPU"), by_id[cid]["statement"]
    assert {c["measured"]["device"] for c in by_id.values()} == {"cpu"}
    # the largest size failed everywhere: claims about it are present, not measured, and say why
    for cid in ("async_blocking", "bandwidth_vs_ceiling", "roundtrip"):
        c = by_id[cid]
        assert c["status"] == "not_measured" and not c["passed"], c
        assert "point format=torch, mode=sync, ranks=1, n_params=262144 failed" in c["reason"], c["reason"]
        assert "checkpoint.scratch_limit_mb" in c["reason"]
    assert by_id["async_blocking"]["measured"]["n_params"] == 262144     # the configured largest size
    assert set(by_id["bandwidth_vs_ceiling"]["measured"]["missing"]) == set(FORMATS)
    roundtrip = by_id["roundtrip"]["measured"]
    assert len(roundtrip["holds"]) == 11 and all(roundtrip["holds"].values())  # every point that ran
    assert len(roundtrip["missing"]) == 11
    assert "dcp/sync/2 rank(s) (process group)/262144" in roundtrip["missing"]
    assert claims["not_measured"] == 3 and claims["passed"] == 1
    assert (out / "raw" / "io.provenance.json").exists() and (out / "claims.html").exists()
