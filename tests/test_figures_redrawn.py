"""The figures redrawn so that each answers one question (issue #41, item 5): what each draws from a
table, checked on hand-made tables.

- spatial strong scaling: one panel per global input (a 40^3 hybrid run is not drawn beside 80^3
  runs as one series); the sensitivity of the paper predictions as one bar per assumption;
- microbatch: one predicted line for policies whose predictions coincide, one point per distinct
  executed plan, each named by who chose it;
- HPO: a parallel-coordinate plot of our own, an axis per hyperparameter that varied;
- hetmem and offload: a grid of panels and a taller timeline instead of thin strips.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from hpcdl.platform.kit.results import MEASURED, MODEL, figure_basis
from hpcdl.platform.kit.stages import pyplot

MiB = 2**20


def _size(path: Path) -> tuple[int, int]:
    with Image.open(path) as img:
        return img.size


def _runs(hybrid_grid: int) -> pd.DataFrame:
    rows = [("strong-d1x1x1", "strong", 1, 1, 1, 80), ("strong-d1x2x1", "strong", 2, 1, 2, 80),
            ("hybrid-d2x1x1", "hybrid", 2, 2, 1, hybrid_grid)]
    df = pd.DataFrame(rows, columns=["run", "kind", "ranks", "data", "depth_ranks", "grid"])
    df["height_ranks"] = 1
    df["depth"] = df["height"] = df["width"] = df["grid"]
    parts = {"compute_s": 0.2, "halo_s": 0.01, "gather_s": 0.01, "allreduce_s": 0.01, "io_s": 0.0}
    for c, v in parts.items():
        df[c] = v
    df["time_per_iter_s"] = 0.25
    return df


def test_strong_scaling_draws_each_global_input_in_its_own_panel(tmp_path):
    from hpcdl.studies.spatial.figures import _plot_scaling, _strong_panels

    block = {"strong": {"grid": 80}, "weak": {"grid": 48}}
    panels = _strong_panels(_runs(40), block)
    assert [(title, list(runs["run"])) for title, runs in panels] == [
        ("global input 80x80x80 (strong runs)", ["strong-d1x1x1", "strong-d1x2x1"]),
        ("global input 40x40x40 (hybrid runs)", ["hybrid-d2x1x1"])]
    same = _strong_panels(_runs(80), block)
    assert [t for t, _ in same] == ["global input 80x80x80 (strong and hybrid runs)"]
    _plot_scaling(pyplot(), _runs(40), block, "strong", tmp_path / "figures")
    assert figure_basis(tmp_path / "figures" / "strong_scaling.png") == MEASURED


def test_the_sensitivity_figure_is_a_model_with_a_bar_per_assumption(tmp_path):
    from hpcdl.studies.spatial.figures import _plot_sensitivity

    rows = []
    for name, values, speedups in (("machine.efficiency", [0.3, 0.5, 0.7], [1.9, 1.84, 1.71]),
                                   ("machine.overlap", [False, True], [1.82, 1.84]),
                                   ("pipeline.bound", ["cached", "file"], [1.84, 1.84])):
        for v, s in zip(values, speedups, strict=True):
            rows.append({"assumption": name, "value": v, "configured": s == 1.84, "network": "unet3d",
                         "gpus_from": 256, "gpus_to": 512, "speedup": s, "ideal_speedup": 2.0})
    _plot_sensitivity(pyplot(), pd.DataFrame(rows), tmp_path / "figures")
    png = tmp_path / "figures" / "paper_sensitivity.png"
    assert figure_basis(png) == MODEL  # stamped "model", and its caption's run part says so
    width, height = _size(png)
    assert height >= 0.25 * width, (width, height)  # one panel, not a strip


def test_identical_policies_are_one_line_and_plans_are_named_by_who_chose_them():
    from hpcdl.studies.microbatch.figures import _budget_lines, _who

    budgets = [16 * MiB, 32 * MiB, 64 * MiB]
    rows = [("all", b, True, s) for b, s in zip(budgets, [0.80, 1.17, 1.19], strict=True)]
    rows += [("powerOfTwo", b, True, s) for b, s in zip(budgets, [0.803, 1.17, 1.19], strict=True)]
    rows += [("undivided", budgets[0], False, np.nan)]
    rows += [("undivided", b, True, s) for b, s in zip(budgets[1:], [1.17, 1.19], strict=True)]
    d = pd.DataFrame(rows, columns=["policy", "budget_bytes", "feasible", "predicted_speedup"])
    pols = ["undivided", "powerOfTwo", "all"]
    assert _budget_lines(d, pols) == [
        ("all", "predicted: all\n(undivided, powerOfTwo: within 1%;\nundivided infeasible at 16 MiB)")]
    # a policy that differs by more than 1 % somewhere keeps its own line
    d.loc[(d["policy"] == "powerOfTwo") & (d["budget_bytes"] == budgets[1]), "predicted_speedup"] = 1.10
    assert [p for p, _ in _budget_lines(d, pols)] == ["all", "powerOfTwo"]

    every = "undivided/dp undivided/ilp powerOfTwo/dp powerOfTwo/ilp all/dp all/ilp"
    assert _who(every, pols) == "every policy (DP and ILP)"
    assert _who("powerOfTwo/ilp all/ilp", pols) == "powerOfTwo, all (ILP)"
    assert _who("undivided/dp all/ilp", pols) == "undivided DP, all ILP"


def test_the_parallel_coordinates_give_an_axis_to_each_varied_hyperparameter():
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from hpcdl.studies.hpo.figures import _axis_position, parallel_coordinate

    lr = FloatDistribution(0.001, 0.01, log=True)
    heights, ticks = _axis_position([0.001, 10 ** -2.5, 0.01], lr)
    assert heights == pytest.approx([0.0, 0.5, 1.0]) and ticks == [(0.0, "0.001"), (1.0, "0.01")]
    opt = CategoricalDistribution(["adam", "sgd", "rmsprop"])
    assert _axis_position(["sgd", "adam", "sgd"], opt) == ([1.0, 0.0, 1.0], [(0.0, "adam"), (1.0, "sgd")])

    dists = {"lr": lr, "optimizer": opt, "width": IntDistribution(16, 64),
             "model": CategoricalDistribution(["mlp"])}
    study = optuna.create_study(direction="maximize")
    for i, (rate, name, width) in enumerate([(0.001, "adam", 16), (0.003, "sgd", 32), (0.01, "adam", 64)]):
        params = {"lr": rate, "optimizer": name, "width": width, "model": "mlp"}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=0.5 + i / 10))
    fig = parallel_coordinate(study)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["validation\naccuracy (%)", "lr", "optimizer", "width"]
    assert "the same in every trial: model=mlp" in ax.get_title()
    trials = [ln for ln in ax.lines if len(ln.get_xdata()) == 4]  # the rest: the axes' vertical lines
    assert len(trials) == 3 and trials[-1].get_linewidth() > trials[0].get_linewidth()  # best thickest
    pyplot().close(fig)


def test_the_policy_panels_are_a_grid_not_a_strip(tmp_path):
    from hpcdl.studies.hetmem.figures import _plot_policies

    rows = [{"app": app, "policy": pol, "capacity": c, "ref_runtime_s": 1.5 - c / 2,
             "all_fast_runtime_s": 1.0, "all_slow_runtime_s": 2.0}
            for app in ("stream", "stencil", "cg", "gups", "mlp") for pol in ("greedy", "random")
            for c in (0.25, 0.5, 0.75)]
    _plot_policies(pyplot(), pd.DataFrame(rows), False, tmp_path)
    width, height = _size(tmp_path / "runtime_vs_fraction.png")
    assert width / height < 2.2, (width, height)  # five apps in two rows of three


def test_the_offload_timeline_is_tall_enough_to_read(tmp_path):
    from hpcdl.studies.offload.figures import _plot_timeline

    lanes = [("compute", "forward", 0.0, 0.002), ("compute", "backward", 0.002, 0.006),
             ("wait", "wait", 0.003, 0.0035), ("to_slow", "to_slow", 0.001, 0.0012),
             ("from_slow", "from_slow", 0.004, 0.0041)]
    tl = pd.DataFrame([{"strategy": "both", "depth": 4, "lane": lane, "kind": kind, "start_s": a,
                        "end_s": b} for lane, kind, a, b in lanes])
    tr = pd.DataFrame([{"strategy": "both", "depth": 4, "hidden_frac": 0.4, "tier": "ram>file",
                        "io_mode": "page_cache"}])
    _plot_timeline(pyplot(), tl, tr, tmp_path / "timeline.png")
    width, height = _size(tmp_path / "timeline.png")
    assert width / height < 2.3, (width, height)  # four lanes with their legend, not a strip
