"""Every analysis stage reads only the files its rule declares (StudyDir.stage_inputs): each stage of
every study, run again in a folder holding nothing but those files copied from the shared test-scale
run (tests/workflow_run.py), writes the same tables and the same verdicts as in the full run folder.
A read of an undeclared file would find nothing there: a table or a claim would differ, or the stage
would fail."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from hpcdl.platform.kit.config import load_config
from hpcdl.platform.kit.study import registered
from hpcdl.platform.orchestration import cli, wiring

RESULTS = "results"  # configs/test.yaml's results_dir, relative to the workflow's directory


def _only_declared(full: Path, into: Path, study: str, stage: str) -> None:
    """Copy into `into` the files the stage's rule declares, as they are in the full run `full`."""
    spec = registered()[study]
    cfg = load_config(full / RESULTS / study / "config.json")
    for name in wiring.stage_inputs(RESULTS, spec, cfg, stage):
        if Path(name).is_absolute():
            continue  # committed files of the checkout (e.g. spatial's GPU calibrations): always there
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(full / name, into / name)


def _pixels(png: Path) -> np.ndarray:
    with Image.open(png) as img:
        return np.asarray(img.convert("RGB"))


def _claims(path: Path) -> dict:
    return {c["id"]: (c["status"], c.get("value"), c.get("reason", ""))
            for c in json.loads(path.read_text())["claims"]}


@pytest.mark.slow
def test_each_stage_runs_on_its_declared_inputs_alone(test_scale_workflow, tmp_path, monkeypatch):
    full = test_scale_workflow.workdir
    assert test_scale_workflow.run.returncode == 0, test_scale_workflow.run.stderr[-3000:]
    for study in test_scale_workflow.studies:
        spec = registered()[study]
        done = full / RESULTS / study
        for stage in ("tables", "figures", "claims"):
            here = tmp_path / study / stage
            _only_declared(full, here, study, stage)
            monkeypatch.chdir(here)
            assert cli.study_main([study, stage, "--config", f"{RESULTS}/{study}/config.json"]) == 0
            out = here / RESULTS / study
            if stage == "tables":
                for t in spec.tables:
                    made, before = (pd.read_csv(d / "tables" / f"{t}.csv") for d in (out, done))
                    pd.testing.assert_frame_equal(made, before, obj=f"{study} {t}")
            elif stage == "figures":  # the same pictures, pixel for pixel
                for f in spec.figures:
                    made, before = (_pixels(d / "figures" / f"{f}.png") for d in (out, done))
                    assert made.shape == before.shape and (made == before).all(), (study, f)
            else:
                assert _claims(out / "claims.json") == _claims(done / "claims.json"), study
