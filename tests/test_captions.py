"""Figure captions written from the run (hpcdl/platform/orchestration/captions.py) and the figures they
caption (hpcdl/platform/kit/results.py: save_figure's "measured on" / "model" stamp).

A caption is fixed text saying what to look at (workflows/report/<study>/<figure>.rst, which states no
outcome: tests/test_studies.py) under the run's part, written by the figures stage: this run's scale,
device and seeds, or "Model, not measured" for a model-only figure.
"""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pandas as pd
import pytest

from hpcdl.platform.kit import stages
from hpcdl.platform.kit.config import load_config
from hpcdl.platform.kit.results import (
    MEASURED,
    MODEL,
    available_cores,
    cpu_model,
    figure_basis,
    save_figure,
    write_table,
)
from hpcdl.platform.kit.study import registered
from hpcdl.platform.orchestration import captions

REPO = Path(__file__).resolve().parent.parent
SPECS = registered()
# The figures that are a model's prediction only (issue #41): each must be drawn as one and say so.
MODEL_FIGURES = {"spatial": {"extrapolation", "paper_predictions", "paper_sensitivity"}}


def _draw(path: Path, model_only: bool = False) -> Path:
    plt = stages.pyplot()
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1])
    return save_figure(fig, path, model_only=model_only)


def _model_only_figures(study: str) -> set[str]:
    """The figures a study's figures stage saves with save_figure(..., model_only=True), read from its
    modules' source: the literal file name in the call's path."""
    found = set()
    for module in (REPO / "hpcdl" / "studies" / study).glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "save_figure"):
                continue
            model_only = [k for k in node.keywords if k.arg == "model_only"]
            if not model_only or getattr(model_only[0].value, "value", False) is not True:
                continue
            names = [n.value for n in ast.walk(node.args[1]) if isinstance(n, ast.Constant)
                     and isinstance(n.value, str) and n.value.endswith(".png")]
            assert len(names) == 1, f"{module}: a model-only figure's file name must be a literal"
            found.add(names[0].removesuffix(".png"))
    return found


def test_a_figure_records_whether_it_is_measured_or_a_model(tmp_path):
    write_table(pd.DataFrame({"x": [1]}), tmp_path / "raw" / "points.csv", {"k": 1}, time.time())
    measured, model = _draw(tmp_path / "figures" / "a.png"), _draw(tmp_path / "figures" / "b.png", True)
    assert (figure_basis(measured), figure_basis(model)) == (MEASURED, MODEL)
    assert figure_basis(tmp_path / "figures" / "none.png") == ""
    plain = tmp_path / "plain.png"  # a PNG that records nothing reads as measured
    fig, _ = stages.pyplot().subplots(figsize=(2, 2))
    fig.savefig(plain)
    assert figure_basis(plain) == MEASURED


def test_the_run_part_names_scale_device_and_seeds_or_says_model(tmp_path):
    spec = SPECS["shuffle"]
    cfg = {"results_dir": str(tmp_path), "shuffle": {"seeds": [0, 1, 2], "q_sweep_seeds": [0],
                                                      "kakurenbo": {"seeds": [3, 4], "fractions": [0.1]}}}
    study = tmp_path / "shuffle"
    write_table(pd.DataFrame({"x": [1]}), study / "raw" / "points.csv", {"k": 1}, time.time())
    _draw(study / "figures" / f"{spec.figures[0]}.png")
    _draw(study / "figures" / f"{spec.figures[1]}.png", model_only=True)
    written = captions.write(spec, cfg, study, ["configs/default.yaml"])
    assert written == [study / "figures" / f"{f}.run.rst" for f in spec.figures]
    device = f"CPU: {cpu_model()} ({available_cores()} cores)"
    device_rst = device.replace("_", "\\_").replace("*", "\\*")
    assert written[0].read_text() == (
        f"**This run:** laptop scale (configs/default.yaml), measured on {device_rst}; seeds: "
        "shuffle.seeds 0, 1, 2; shuffle.q\\_sweep\\_seeds 0; shuffle.kakurenbo.seeds 3, 4.\n")
    assert written[1].read_text().startswith("**Model, not measured:** computed at laptop scale "
                                             "(configs/default.yaml) from the config and this run's tables")
    assert "nothing in this figure is a measurement" in written[1].read_text()
    # Without provenance and config files, the part says what it does not know.
    bare = tmp_path / "bare"
    captions.write(spec, {"results_dir": str(tmp_path), "shuffle": {}}, bare, [])
    assert (bare / "figures" / f"{spec.figures[0]}.run.rst").read_text() == (
        "**This run:** scale unknown (no config file named), measured on an unknown device (no provenance "
        "sidecars); seeds: none in the config (nothing random is drawn).\n")


def test_a_device_name_cannot_break_the_caption(tmp_path):
    """rst markup in what a run reports (a CPU model with * or _) is escaped, not interpreted."""
    from docutils.core import publish_parts

    f = {"scale": "test scale (configs/test.yaml)", "device": "CPU: Weird*CPU_x |y| `z` (2 cores)",
         "seeds": "s.seed 0"}
    label, sentence = captions.run_sentence(f, MEASURED)
    text = publish_parts(f"**{label}:** {captions._rst(sentence)}", writer="html")["body"]
    assert "Weird*CPU_x |y| `z` (2 cores)" in text and "problematic" not in text


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_figure_caption_opens_with_the_runs_part(name):
    spec = SPECS[name]
    for figure in spec.figures:
        first = spec.caption(figure).read_text().splitlines()[0]
        assert first == captions.include_line(name, figure), (name, figure, first)
    claims = (REPO / "workflows" / "report" / name / "claims.rst").read_text()
    assert ".. include::" not in claims  # the claims page names its device and scale itself


@pytest.mark.parametrize("name", sorted(SPECS))
def test_model_only_figures_are_drawn_and_captioned_as_models(name):
    model = _model_only_figures(name)
    assert MODEL_FIGURES.get(name, set()) <= model, (name, model)
    for figure in model:
        text = " ".join(captions.static_text(SPECS[name], figure).split())
        assert "Model only" in text, (name, figure)
    for figure in set(SPECS[name].figures) - model:  # a measured figure is not called a model
        assert "Model only" not in captions.static_text(SPECS[name], figure), (name, figure)


def test_the_about_page_shows_the_headline_with_its_caption(tmp_path):
    """The headline figure is embedded (the report shows the page from a data: URI), sized for the
    frame, with the run's part of its caption and what to look at."""
    import base64
    import re

    from hpcdl.platform.orchestration import about

    spec = SPECS["spatial"]
    cfg = {"results_dir": str(tmp_path), **load_config(REPO / "configs" / "test.yaml")}
    study = tmp_path / "spatial"
    write_table(pd.DataFrame({"x": [1]}), study / "raw" / "runs.csv", {"k": 1}, time.time())
    png = _draw(study / "figures" / f"{spec.headline}.png")
    captions.write(spec, cfg, study, ["configs/test.yaml"])
    page = about.write(spec, cfg, study, ["configs/test.yaml"], papers=tmp_path / "none.yaml").read_text()
    img = re.search(r"<img src='data:image/png;base64,([^']+)' alt='efficiency' style='width:([^']+)'>", page)
    assert img and base64.b64decode(img.group(1)) == png.read_bytes()
    assert img.group(2).startswith("min(100%, max(82vw, calc(85vh * ")
    caption = re.search(r"<figcaption>(.*?)</figcaption>", page, re.S).group(1)
    assert "<strong>This run:</strong> test scale (configs/test.yaml)" in caption
    assert "machine&#x27;s own ceiling" in caption or "machine's own ceiling" in caption
    assert ".. include::" not in caption
