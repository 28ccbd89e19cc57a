"""The platform's side of the analysis stages: shared helpers (hpcdl/platform/kit/stages.py), the rules'
files and commands (hpcdl/platform/orchestration/wiring.py) and the CLI
(hpcdl/platform/orchestration/cli.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from hpcdl.platform.kit import stages
from hpcdl.platform.kit.results import available_cores, cpu_model, save_figure, write_table
from hpcdl.platform.kit.sidecars import measured_on
from hpcdl.platform.kit.study import StudySpec, registered
from hpcdl.platform.kit.study_dir import StudyDir
from hpcdl.platform.orchestration import about, wiring

REPO = Path(__file__).resolve().parent.parent


def test_read_or_empty_reads_a_table_or_gives_an_empty_one(tmp_path):
    path = tmp_path / "t.csv"
    assert stages.read_or_empty(path).empty
    assert list(stages.read_or_empty(path, columns=["kind", "error"]).columns) == ["kind", "error"]
    path.write_text("")
    assert stages.read_or_empty(path).empty
    path.write_text("a,b\n")
    header_only = stages.read_or_empty(path)
    assert header_only.empty and list(header_only.columns) == ["a", "b"]
    path.write_text("a,b\n1,2\n")
    assert stages.read_or_empty(path).to_dict("records") == [{"a": 1, "b": 2}]


def test_ok_rows_keeps_the_succeeded_points():
    df = pd.DataFrame({"status": ["ok", "failed", "ok"], "x": [1, 2, 3]})
    assert stages.ok_rows(df)["x"].tolist() == [1, 3]
    assert stages.ok_rows(pd.DataFrame({"x": [1]}))["x"].tolist() == [1]
    assert stages.ok_rows(pd.DataFrame()).empty


def test_a_failure_is_told_by_its_last_error_line_cut_to_size():
    error = "Traceback (most recent call last):\n  File x\nRuntimeError: " + "e" * 500 + "\n\n"
    line = stages.last_error_line(error)
    assert line.startswith("RuntimeError: ") and len(line) == stages.ERROR_CHARS
    assert stages.last_error_line("  \n") == "no error text"
    assert stages.failed_because("point a=1", "boom\nOSError: EIO") == "point a=1 failed: OSError: EIO"


def test_a_failed_point_is_recorded_and_named_back_by_its_keys():
    raws = {"io": pd.DataFrame({"format": ["a", "b", "c"], "mode": ["sync", "async", "sync"],
                                "n_params": [10, 10, float("nan")], "status": ["ok", "failed", "failed"],
                                "error": [None, "Traceback\nOSError: disk full", "boom"]}),
            "resume": pd.DataFrame({"x": [1]})}
    fails = stages.failures_table(raws, ("format", "mode", "n_params", "absent"))
    assert fails.to_dict("records") == [
        {"kind": "io", "point": "format=b, mode=async, n_params=10.0",
         "error": "Traceback\nOSError: disk full"},
        {"kind": "io", "point": "format=c, mode=sync", "error": "boom"}]
    assert (stages.why_point_missing(fails, "io", format="b", mode="async")
            == "point format=b, mode=async failed: OSError: disk full")
    assert stages.why_point_missing(fails, "io", format="a") == "point format=a is not in the table"
    assert stages.why_point_missing(fails, "resume", format="b") == "point format=b is not in the table"
    assert list(stages.failures_table({}, ("format",)).columns) == stages.FAILURE_COLUMNS


def test_started_at_reads_the_raw_tables_sidecar(tmp_path):
    started = time.time() - 3600
    write_table(pd.DataFrame({"x": [1]}), tmp_path / "raw" / "points.csv", {"k": 1}, started)
    assert stages.started_at(tmp_path, "points") == pytest.approx(started, abs=1.0)
    assert abs(stages.started_at(tmp_path, "absent") - time.time()) < 5


TOY = StudySpec(name="toy", title="Toy", raw_tables=("points", "log"), tables=("squares",),
                figures=("curve",), task_units=lambda cfg: 1, run_resources=lambda cfg: {},
                run_files=lambda cfg: (f"{cfg['results_dir']}/toy/journal.log",))


def test_every_file_a_stage_reads_is_its_input():
    cfg = {"results_dir": "res"}
    raw = ["res/toy/raw/points.csv", "res/toy/raw/points.provenance.json", "res/toy/raw/log.csv",
           "res/toy/raw/log.provenance.json", "res/toy/raw/run_summary.json", "res/toy/raw/device.json",
           "res/toy/journal.log"]
    assert wiring.raw_files("res", TOY, cfg) == raw
    tables = ["res/toy/tables/squares.csv", "res/toy/tables/squares.provenance.json"]
    assert wiring.table_files("res", TOY) == tables
    assert wiring.stage_inputs("res", TOY, cfg, "tables") == ["res/toy/config.json", *raw]
    for stage in ("figures", "claims"):
        assert wiring.stage_inputs("res", TOY, cfg, stage) == ["res/toy/config.json", *raw, *tables]
    assert wiring.verdict_inputs("res", [TOY], cfg) == ["res/toy/claims.json", *raw]
    assert wiring.stage_inputs("res", TOY, cfg, "about") == ["res/toy/config.json", *raw]
    with pytest.raises(ValueError, match="unknown stage 'plot'; stages: tables, figures, claims, about"):
        wiring.stage_inputs("res", TOY, cfg, "plot")
    assert wiring.stage_command("toy", "claims", "res/toy/config.json") == \
        "python -m hpcdl toy claims --config res/toy/config.json"
    for stage in ("figures", "about"):  # the run's scale, in the captions and on the about page
        assert wiring.stage_command("toy", stage, "res/toy/config.json", ["configs/a b.yaml"]) == \
            f"python -m hpcdl toy {stage} --config res/toy/config.json --config-files 'configs/a b.yaml'"
    assert wiring.stage_command("toy", "claims", "res/toy/config.json", ["configs/a.yaml"]) == \
        "python -m hpcdl toy claims --config res/toy/config.json"
    # The figures stage writes the run's part of each caption beside its figure; the about page reads
    # the headline figure, that part and the caption file.
    assert wiring.caption_files("res", TOY) == [f"res/toy/figures/{f}.run.rst" for f in TOY.figures]
    assert wiring.headline_files("res", INTRODUCED) == [
        "res/toy/figures/bars.png", "res/toy/figures/bars.run.rst",
        str(REPO / "workflows" / "report" / "toy" / "bars.rst")]
    assert wiring.headline_files("res", TOY) == []  # no headline figure declared


def test_the_config_files_are_shown_once_and_relative_where_they_can_be(tmp_path):
    (tmp_path / "configs").mkdir()
    given = [str(tmp_path / "configs" / "default.yaml"), "configs/default.yaml", "/elsewhere/paper.yaml"]
    shown = wiring.config_files_shown(given, str(tmp_path))
    assert shown == ["configs/default.yaml", "/elsewhere/paper.yaml"]


INTRODUCED = StudySpec(name="toy", title="Toy <study>", raw_tables=("points",), tables=("squares",),
                       figures=("curve", "bars", "area"), task_units=lambda cfg: 1,
                       run_resources=lambda cfg: {}, question="Do squares grow faster than lines?",
                       headline="bars", setting=lambda cfg: f"{cfg['toy']['n']} points")


def test_a_study_opens_with_its_question_answer_setting_and_headline(tmp_path):
    cfg = {"results_dir": "res", "toy": {"n": 7, "seed": 3}}
    write_table(pd.DataFrame({"x": [1]}), tmp_path / "raw" / "points.csv", {"k": 1}, time.time())
    device = f"CPU: {cpu_model()} ({available_cores()} cores)"
    none = tmp_path / "none.yaml"  # no published results to set beside it
    page = about.write(INTRODUCED, cfg, tmp_path, ["configs/test.yaml"], papers=none).read_text()
    # The full title heads the page (the menu lists the short one); then the question and the answer.
    assert "<h1 class='study-title' data-study='toy'>Toy &lt;study&gt;</h1>" in page
    assert "<p class='question'><b>Question.</b> Do squares grow faster than lines?</p>" in page
    assert ("<b>Answer.</b> No answer from this run yet: the study has no claims.json (its claims stage has "
            "not run).") in page
    setting = re.search(r"<p class='setting'><b>Setting.</b> (.*?)</p>", page).group(1)
    assert setting == (f"test scale (configs/test.yaml), results in res; 7 points; seeds: toy.seed 3; "
                       f"measured on {device}.")
    assert "The headline figure bars has not been drawn" in page
    # Without provenance the page says so instead of naming a device.
    bare = about.write(INTRODUCED, cfg, tmp_path / "none", [], papers=none).read_text()
    assert "measured on an unknown device (no provenance sidecars)" in bare
    # The category lists the page, the headline, the other figures, the claims.
    labels = [about.report_label(INTRODUCED, i) for i in ("claims", "area", "curve", "bars", "about")]
    assert sorted(labels) == ["0 · about this study", "1 · bars", "2 · area", "2 · curve", "3 · claims"]
    with pytest.raises(ValueError, match="study toy has no figure 'line'; figures: curve, bars, area"):
        about.report_label(INTRODUCED, "line")


def test_the_device_comes_from_provenance_and_marks_every_figure(tmp_path):
    assert measured_on([]) == ""
    assert measured_on([{"cpu_model": "EPYC", "cores": 2}, {"cores": 4}]) == \
        "CPU: EPYC (2 cores) / unknown model (4 cores)"
    assert measured_on([{"cpu_model": "EPYC", "cores": 16, "gpu_model": "NVIDIA H100"}]) == "GPU: NVIDIA H100"
    plt = stages.pyplot()

    def height(path):
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot([0, 1], [0, 1])
        save_figure(fig, path)
        return plt.imread(path).shape[0]

    bare = height(tmp_path / "figures" / "a.png")  # no sidecars: nothing to say
    write_table(pd.DataFrame({"x": [1]}), tmp_path / "raw" / "points.csv", {"k": 1}, time.time())
    assert StudyDir(tmp_path).measured_on() == f"CPU: {cpu_model()} ({available_cores()} cores)"
    assert height(tmp_path / "figures" / "b.png") > bare  # the line below the axes
    assert height(tmp_path / "elsewhere" / "c.png") == bare  # not a study's figure


def test_the_cli_names_what_it_refuses(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "hpcdl", *args], capture_output=True, text=True,
                              cwd=REPO, timeout=120)

    study = next(iter(registered()))
    bad = cli(study, "plot", "--config", "configs/test.yaml")
    assert bad.returncode == 2 and "invalid choice: 'plot'" in bad.stderr
    missing = cli(study, "tables", "--config", str(tmp_path / "none.yaml"))
    assert missing.returncode == 2 and "none.yaml" in missing.stderr
    no_summary = cli("checkpoint", "summary", "--config", "configs/test.yaml")
    assert no_summary.returncode == 2 and "no summary stage" in no_summary.stderr
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"results_dir": str(tmp_path / "r"), "studies": ["checkpoint"]}))
    other = cli("hpo", "tables", "--config", str(cfg))
    assert other.returncode == 2 and "has no 'hpo' block" in other.stderr
