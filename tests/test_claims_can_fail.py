"""Claims that can fail, or say they cannot (#60, item 6): a claim whose check compares a thing with
itself (a plan that is the default or its baseline, a pick no other family contests, a calibration
read from a file rather than measured) says so instead of passing on it.

Every table here is HAND-MADE (tests/test_claims.py's baseline tables, mutated; a calibration written
by the test): nothing is measured.
"""

from __future__ import annotations

import json

import pandas as pd
from test_claims import _find, _run

from hpcdl.platform.kit.claims import write_claims
from hpcdl.platform.kit.confirmation import describe
from hpcdl.studies.microbatch.cudnn import plan as cudnn_plan
from hpcdl.studies.spatial import claims as spatial_claims

PREDICTION = "algorithm_choice_prediction_within_tolerance"


def _unmoved(t, network=None):
    """HAND-MADE: the plans (of `network`, or all) move no layer off the default."""
    d = t["tables/network_speedup.csv"]
    sel = d["network"] == network if network else d.index >= 0
    d.loc[sel, "layers_changed"] = 0
    d.loc[sel, "keeps_default"] = True


def test_prediction_is_not_measured_when_no_layer_leaves_the_default(tmp_path):
    """HAND-MADE tables: every plan is the default (the H200 record's case), so the prediction would be
    the default's time against itself: not measured, not passed."""
    c = _find(_run("microbatch", lambda cfg, t: _unmoved(t), tmp_path), PREDICTION)
    assert c["status"] == "not_measured", c
    assert "no layer left the default in any plan" in c["reason"] and "nothing to predict" in c["reason"]
    assert sorted(n.split()[0] for n in c["measured"]["nothing_to_predict"]) == ["alexnet", "resnet18",
                                                                                  "resnet18"]
    assert c["measured"]["scaled_error_per_round"] == {}


def test_prediction_judges_the_plans_that_move_and_lists_the_default_ones(tmp_path):
    """HAND-MADE tables: AlexNet's one plan is the default, with rounds that would miss the tolerance;
    ResNet-18's two plans move layers and are predicted within it. The default plan is left out."""
    def mutate(cfg, t):
        _unmoved(t, "alexnet")
        r = t["tables/network_rounds.csv"]
        r.loc[r["network"] == "alexnet", "prediction_error_scaled_frac"] = [-0.25, -0.24, -0.26]

    c = _find(_run("microbatch", mutate, tmp_path), PREDICTION)
    assert c["status"] == "passed", c
    assert c["measured"]["nothing_to_predict"] == ["alexnet [undivided, all]"]
    assert set(c["measured"]["holds"]) == {"resnet18 [undivided]", "resnet18 [all]"}
    assert "alexnet" not in str(c["measured"]["unscaled_predicted_over_measured_minus_1"])


def test_cudnn_plan_equal_to_its_baseline_is_nothing_to_judge(tmp_path):
    """HAND-MADE engine tables: at 512 MiB every kernel's DP and ILP plan runs its baseline's engine
    undivided (one measurement against itself): listed as nothing to judge, not held. The 8 MiB ILP
    divides nothing yet picks another engine: it is judged."""
    c = _find(_run("microbatch", None, tmp_path), "cudnn_plan_not_slower")
    assert c["status"] == "passed", c
    m = c["measured"]
    nothing = {f"{n} {p} 512 MiB [powerOfTwo]" for n in ("alexnet", "resnet18") for p in ("dp", "ilp")}
    assert set(m["nothing_to_judge"]) == nothing
    assert not nothing & set(m["holds"]) and not nothing & set(m["worst_per_limit"])
    assert m["holds"]["alexnet ilp 8 MiB [powerOfTwo]"] is True and m["divided_kernels"][
        "alexnet ilp 8 MiB [powerOfTwo]"] == "0/3"


def test_cudnn_plan_not_slower_is_not_measured_when_every_plan_is_its_baseline(tmp_path):
    """HAND-MADE engine tables cut to the 512 MiB limit, where every plan is its baseline: no item is
    left to judge, so the claim is not measured and says why."""
    def mutate(cfg, t):
        lim = t["tables/cudnn_limits.csv"]
        lim = lim[lim["limit_label"] == "512 MiB"]
        t["tables/cudnn_limits.csv"], t["tables/cudnn_networks.csv"] = lim, cudnn_plan.rollup(lim)
        cfg["microbatch"]["cudnn"]["limits_mib"] = [512]

    c = _find(_run("microbatch", mutate, tmp_path), "cudnn_plan_not_slower")
    assert c["status"] == "not_measured", c
    assert "nothing to judge: every plan is its baseline" in c["reason"]
    assert "alexnet ilp 512 MiB [powerOfTwo]" in c["reason"]
    assert not c["measured"].get("holds") and len(c["measured"]["nothing_to_judge"]) == 4


def _uncontested(t):
    """HAND-MADE: at 16 GPUs the filter split no longer fits; data never did: only data x spatial runs."""
    ext = t["tables/extrapolation.csv"]
    ext["infeasible_reason"] = ""
    ext.loc[(ext["gpus"] == 16) & (ext["family"] == "filter"), ["feasible", "infeasible_reason"]] = [
        False, "memory: 20 GB > 16 GB"]


def test_oracle_pick_uncontested_is_not_measured(tmp_path):
    """HAND-MADE extrapolation: no family but data x spatial is feasible at 16 GPUs, so the spatial pick is
    forced and the claim would only repeat oracle_error: not measured, with the reason."""
    c = _find(_run("spatial", lambda cfg, t: _uncontested(t), tmp_path), "oracle_picks_spatial")
    assert c["status"] == "not_measured", c
    assert c["reason"].startswith("not measured: uncontested: no other family is feasible at 16 GPUs and "
                                  "mini-batch 16")
    assert "only repeat oracle_error" in c["reason"] and "data, filter cannot run" in c["reason"]
    assert c["measured"]["contested"] is False and c["measured"]["families_at_scale"]["filter"] == (
        "memory: 20 GB > 16 GB")


def test_oracle_pick_uncontested_stays_not_measured_when_the_oracle_misses(tmp_path):
    """HAND-MADE tables: uncontested and the oracle misses: the miss is oracle_error's own finding, and
    this claim still has nothing of its own to judge."""
    def mutate(cfg, t):
        _uncontested(t)
        t["tables/runs.csv"]["oracle_error"] = 0.4

    claims = _run("spatial", mutate, tmp_path)
    assert _find(claims, "oracle_error")["status"] == "failed"
    assert _find(claims, "oracle_picks_spatial")["status"] == "not_measured"


def _calibration(folder, gpu="NVIDIA H100 80GB HBM3", sessions=None):
    """A HAND-MADE calibration file and its provenance sidecar (nothing measured)."""
    folder.mkdir(parents=True, exist_ok=True)
    slug = gpu.lower().replace(" ", "-")
    pd.DataFrame({"id": ["step|cosmoflow|4x2"], "kind": ["step"], "key": [""], "median_s": [0.4]}).to_csv(
        folder / f"{slug}.csv", index=False)
    meta = {"gpu_model": gpu, "date": "2026-11-27T01:00:00+0000", "git_commit": "fa30b3b69f01-dirty",
            "partial": True, "items": 854, "sessions": sessions or [
                {"date": "2026-11-26T18:08:51+0000", "git_commit": "fa30b3b69f01-dirty"},
                {"date": "2026-11-27T01:00:00+0000", "git_commit": "fa30b3b69f01-dirty"}]}
    (folder / f"{slug}.provenance.json").write_text(json.dumps(meta))
    return folder / f"{slug}.csv"


def _compute_term(tmp_path, cfg_mutate):
    """The compute_term claim as written to claims.json (its confirmation attached by write_claims)."""
    def mutate(cfg, t):
        cfg["data"] = {"resources_dir": str(tmp_path / "resources")}
        cfg["spatial"]["seed"] = 0  # loss_falls' confirmation key
        cfg["spatial"]["gpu_calibration"]["use"] = "auto"
        cfg_mutate(cfg)
        mutate.cfg = cfg

    claims = _run("spatial", mutate, tmp_path)
    write_claims(tmp_path / "spatial", "spatial", claims, spatial_claims.CLAIMS,
                 confirmation=spatial_claims.CONFIRMATION, block=mutate.cfg["spatial"])
    doc = json.loads((tmp_path / "spatial" / "claims.json").read_text())
    return _find(doc["claims"], "compute_term"), (tmp_path / "spatial" / "claims.html").read_text()


def test_compute_term_read_from_the_committed_calibration_names_it(tmp_path):
    """HAND-MADE calibration under the config's resources_dir and no calibration of this run's own: the
    confirmation names the committed file, its GPU, dates and commit, and says it was not measured here."""
    path = _calibration(tmp_path / "resources" / "calibration")
    c, page = _compute_term(tmp_path, lambda cfg: None)
    line = describe(c["confirmation"])
    assert line == (f"no confirmation seeds: read from the committed calibration {path} (NVIDIA H100 80GB "
                    "HBM3, 2026-11-26 to 2026-11-27, commit fa30b3b-dirty; partial: 1 of 854 items), not "
                    "measured in this run")
    assert "measured afresh" not in line and "not measured in this run" in page
    assert c["measured"]["calibration"]["file"] == str(path) and not c["measured"]["calibration"]["this_run"]
    assert c["status"] == "passed"  # the verdict is the same; only where it rests is named


def test_compute_term_from_this_runs_own_calibration_is_measured_afresh(tmp_path):
    """HAND-MADE calibration in the run's raw/gpu_calibration/ (the study calibrated on its GPU), beside a
    committed one: the run's own is read, and the confirmation says it was measured afresh."""
    _calibration(tmp_path / "resources" / "calibration")
    _calibration(tmp_path / "spatial" / "raw" / "gpu_calibration")
    c, _ = _compute_term(tmp_path, lambda cfg: None)
    assert describe(c["confirmation"]) == ("no confirmation seeds: GPU times of this run's own calibration "
                                           "raw/gpu_calibration/nvidia-h100-80gb-hbm3.csv, measured afresh: "
                                           "no seed decides them")
    assert c["measured"]["calibration"]["this_run"] is True
