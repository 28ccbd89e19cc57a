"""Exploration and confirmation apart (issue #40, hpcdl.platform.kit.confirmation): every claim names the
seeds (or inputs) it is confirmed on and whether tuning saw them, or why no seed decides it; a study whose
declaration misses a claim is refused; the pages say "confirmed on unseen seeds" where that holds."""

from __future__ import annotations

import importlib
import json

import pandas as pd
import pytest
from scipy import stats

from hpcdl.platform.kit.claims import claim, declared, write_claims
from hpcdl.platform.kit.config import ConfigError, load_config, studies, validate_config
from hpcdl.platform.kit.confirmation import confirmed_on, describe, deterministic, unseeded
from hpcdl.platform.kit.intervals import FAILS, HOLDS, STRADDLES, above, proportion_interval
from hpcdl.platform.orchestration import claim_lines
from hpcdl.platform.orchestration.cli import run_stage

IDS = ["fast", "exact", "per_M{M}"]
DECLARED = {"fast": confirmed_on("seeds"), "exact": deterministic("bit-identical resume"),
            "per_M{M}": confirmed_on("knobs.seeds", default_key="seeds")}


def _claims():
    return [claim("fast", "A beats B", True, speedup=2.0, threshold=1.0),
            claim("exact", "resume equals the straight run", True, equal=True),
            claim("per_M4", "holds at M=4", False, gap=3.0, threshold=1.0)]


def _doc(tmp_path, block, declaration=DECLARED):
    write_claims(tmp_path, "demo", _claims(), IDS, confirmation=declaration, block=block)
    return {c["id"]: c for c in json.loads((tmp_path / "claims.json").read_text())["claims"]}


def test_each_claim_names_its_seeds_and_whether_tuning_saw_them(tmp_path):
    block = {"seeds": [3, 4], "exploration": {"seeds": [0, 1, 2]}}
    got = _doc(tmp_path, block)
    assert got["fast"]["confirmation"] == {"seeds": [3, 4], "key": "seeds", "exploration": [0, 1, 2],
                                           "unseen": True}
    assert got["exact"]["confirmation"] == {"none": "deterministic check: bit-identical resume"}
    # a `{M}` id takes its declared entry; the block has no knobs.seeds, so the study's fallback key is used
    assert got["per_M4"]["confirmation"]["key"] == "seeds" and got["per_M4"]["confirmation"]["unseen"]
    page = (tmp_path / "claims.html").read_text()
    assert "confirmed on unseen seeds 3, 4 (seeds; exploration: 0, 1, 2)" in page
    assert "no confirmation seeds: deterministic check: bit-identical resume" in page
    assert "2 of 3 confirmed on unseen seeds or inputs" in page


def test_a_seed_tuning_saw_is_not_unseen_and_an_unrecorded_exploration_never_is(tmp_path):
    seen = _doc(tmp_path / "seen", {"seeds": [2, 3], "exploration": {"seeds": [0, 1, 2]}})["fast"]
    assert seen["confirmation"]["unseen"] is False
    assert describe(seen["confirmation"]) == ("judged on seeds 2, 3 (seeds), not unseen: 2 also shaped "
                                              "choices (exploration: 0, 1, 2)")
    blind = _doc(tmp_path / "blind", {"seeds": [5]})["fast"]
    assert blind["confirmation"] == {"seeds": [5], "key": "seeds", "exploration": None, "unseen": False}
    assert "exploration seeds not recorded" in describe(blind["confirmation"])
    # an empty record says nothing was tuned on the key: then every seed is unseen
    nothing = _doc(tmp_path / "none", {"seeds": [0], "exploration": {"seeds": []}})["fast"]
    assert nothing["confirmation"]["unseen"]


def test_inputs_compare_whole_items_and_a_scalar_seed_is_one_seed(tmp_path):
    jobs = [{"arrival_s": 0, "iterations": 25}, {"arrival_s": 0.5, "iterations": 50}]
    decl = {**DECLARED, "fast": confirmed_on("cosched.jobs", kind="inputs"), "exact": confirmed_on("seed")}
    block = {"seed": 1, "seeds": [1], "cosched": {"jobs": jobs},
             "exploration": {"seed": [0], "cosched.jobs": [dict(reversed(jobs[1].items()))]}}
    got = _doc(tmp_path, block, decl)
    assert got["fast"]["confirmation"]["inputs"] == jobs and got["fast"]["confirmation"]["unseen"] is False
    assert got["exact"]["confirmation"] == {"seeds": [1], "key": "seed", "exploration": [0], "unseen": True}
    assert "not unseen: 1 item also shaped choices" in describe(got["fast"]["confirmation"])


@pytest.mark.parametrize("declaration, words", [
    ({"fast": DECLARED["fast"], "exact": DECLARED["exact"]}, ["study demo", "claim 'per_M{M}'",
                                                              "declares no confirmation",
                                                              "hpcdl/studies/demo/claims.py CONFIRMATION"]),
    ({**DECLARED, "slow": unseeded("timing")}, ["study demo", "'slow'", "not a claim of the study"]),
    ({**DECLARED, "fast": "seeds"}, ["study demo", "['fast']", "use confirmed_on"]),
    ({**DECLARED, "fast": confirmed_on("repeats")}, ["study demo, claim fast", "config key 'repeats'"]),
])
def test_a_declaration_that_misses_or_names_a_wrong_claim_is_refused_before_writing(declaration, words,
                                                                                     tmp_path):
    with pytest.raises(ValueError) as err:
        write_claims(tmp_path, "demo", _claims(), IDS, confirmation=declaration, block={"seeds": [1]})
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    assert not (tmp_path / "claims.json").exists() and not (tmp_path / "claims.html").exists()
    with pytest.raises(ValueError, match="kind must be one of"):
        confirmed_on("seeds", kind="repeats")


def test_the_stage_refuses_a_study_without_a_declaration(tmp_path, monkeypatch):
    cfg = load_config("configs/test.yaml", {"results_dir": str(tmp_path), "studies": ["hpo"]})
    _hpo_tables(tmp_path / "hpo")
    module = importlib.import_module("hpcdl.studies.hpo.claims")
    monkeypatch.delattr(module, "CONFIRMATION")
    with pytest.raises(ValueError, match=r"study hpo: claim 'hpo.grid_speedup' declares no confirmation"):
        run_stage("hpo", "claims", cfg, tmp_path / "hpo")
    assert not (tmp_path / "hpo" / "claims.json").exists()


def _hpo_tables(study_dir):
    tables = study_dir / "tables"
    tables.mkdir(parents=True)
    pd.DataFrame({"workers": [1, 2], "n_trials": [4, 4], "elapsed_s": [10.0, 5.5]}).to_csv(
        tables / "grid_scaling.csv", index=False)
    pd.DataFrame({"study": ["random"], "val_acc": [0.86], "test_acc": [0.8544], "test_n": [10000],
                  "overall_best": [True]}).to_csv(tables / "best_config.csv", index=False)
    pd.DataFrame([{"baseline": "random", "pruned": "random-median", "baseline_trial_epochs": 100,
                   "pruned_trial_epochs": 58, "saving_fraction": 0.42, "loss_pts": 0.3}]).to_csv(
        tables / "pruning.csv", index=False)


def test_the_claims_stage_attaches_the_studys_declaration_and_the_verdict_line_shows_it(tmp_path, capsys):
    cfg = load_config("configs/default.yaml", {"results_dir": str(tmp_path), "studies": ["hpo"]})
    _hpo_tables(tmp_path / "hpo")
    run_stage("hpo", "claims", cfg, tmp_path / "hpo")
    doc = json.loads((tmp_path / "hpo" / "claims.json").read_text())
    got = {c["id"]: c for c in doc["claims"]}
    # the laptop run judges pruning on seed 1; its pruner was tuned replaying seed 0
    assert got["hpo.pruning"]["confirmation"] == {"seeds": [1], "key": "seed", "exploration": [0],
                                                  "unseen": True}
    assert got["hpo.pruning"]["tuned"][0]["key"] == "pruner"
    assert "no seed decides" in got["hpo.grid_speedup"]["confirmation"]["none"]
    # 0.8544 on 10000 images: about 1.2 standard errors above 0.85, so its interval crosses the line
    acc = got["hpo.best_test_acc"]
    assert acc["status"] == "straddles" and acc["measured"]["test_acc"]["n"] == 10000
    low, high = acc["measured"]["test_acc"]["ci95"]
    assert (low, high) == (pytest.approx(0.8474, abs=1e-4), pytest.approx(0.8612, abs=1e-4))
    assert "confirmed on unseen seeds 1 (seed; exploration: 0)" in capsys.readouterr().out
    page = claim_lines.render_lines([{"study": "hpo", "title": "HPO", "state": "ran", "claims": doc["claims"],
                                      "claims_page": "hpo/claims.html"}])
    line = page[page.index("data-claim-line='hpo.pruning'"):]
    line = line[:line.index("</tr>")]
    assert "class='confirmation unseen'" in line and "confirmed on unseen seeds 1" in line
    assert "data-legend='unseen'" in claim_lines.render_legend()


@pytest.mark.parametrize("study", studies())
@pytest.mark.parametrize("name", ["default.yaml", "paper.yaml", "test.yaml"])
def test_every_study_declares_the_confirmation_of_each_claim(study, name, repo):
    """Every declared claim id has its entry, and each resolves against the repo configs' study block."""
    module = importlib.import_module(f"hpcdl.studies.{study}.claims")
    declaration = getattr(module, "CONFIRMATION", None)
    assert declaration is not None, f"hpcdl/studies/{study}/claims.py has no CONFIRMATION"
    assert set(declaration) == set(module.CLAIMS)
    cfg = load_config(repo / "configs" / name)
    if study not in cfg:
        pytest.skip(f"{name} runs no {study}")
    claims = [claim(cid.replace("{M}", "4"), "s", True, x=1) for cid in module.CLAIMS]
    from hpcdl.platform.kit.claims import attach_confirmation

    for c in attach_confirmation(claims, study, declaration, module.CLAIMS, cfg[study]):
        assert any(declared(c["id"], [d]) for d in module.CLAIMS)
        conf = c["confirmation"]
        assert ("none" in conf and conf["none"]) or (conf["key"] and conf.get("seeds", conf.get("inputs")))


def test_the_laptop_run_judges_the_tuned_claims_on_seeds_tuning_never_saw(repo):
    from hpcdl.platform.kit.confirmation import resolve_all

    cfg = load_config(repo / "configs" / "default.yaml")

    def entries(study):
        module = importlib.import_module(f"hpcdl.studies.{study}.claims")
        return resolve_all(study, module.CONFIRMATION, module.CLAIMS, cfg[study])

    hpo, shuffle, malleable = entries("hpo"), entries("shuffle"), entries("malleable")
    assert hpo["hpo.pruning"]["unseen"] and hpo["hpo.best_test_acc"]["unseen"]
    assert shuffle["kakurenbo_saves_time"] == {"seeds": [10, 11, 12, 13, 14], "key": "kakurenbo.seeds",
                                               "exploration": [0, 1, 2, 3, 4, 5, 6], "unseen": True}
    assert shuffle["random_local_partial_match_global_M{M}"]["unseen"]
    # the Q sweep's seed is one of the claims' seeds, so every swept Q pairs with global by seed
    assert set(cfg["shuffle"]["q_sweep_seeds"]) <= set(cfg["shuffle"]["seeds"])
    # the workload was shaped until malleable won and is not seeded: seen, and said so
    assert malleable["malleable_beats_rigid"]["unseen"] is False
    assert any(n["key"] == "cosched.jobs" for n in cfg["malleable"]["tuned"])
    gate = [n for n in cfg["shuffle"]["tuned"] if n["key"] == "kakurenbo.min_net_saving"]
    assert gate and "left F=0.1" in gate[0]["why"]


def test_an_exploration_entry_must_name_a_key_of_its_block():
    cfg = validate_config({"studies": ["shuffle"], "shuffle": {"exploration": {"seeds": [0]}}})
    assert cfg["shuffle"]["exploration"] == {"seeds": [0]}
    assert validate_config({"studies": ["hpo"]})["hpo"]["exploration"] == {}   # every block, default none
    with pytest.raises(ConfigError) as err:
        validate_config({"studies": ["shuffle"], "shuffle": {"exploration": {"kakurenbo.nope": [0]}}})
    assert err.value.key == "shuffle.exploration.kakurenbo.nope"
    assert "a seed or input key of the shuffle block" in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate_config({"studies": ["hpo"], "hpo": {"exploration": {"seed": 0}}})
    assert err.value.key == "hpo.exploration.seed" and "array" in str(err.value)


@pytest.mark.parametrize("fraction, n", [(0.8544, 10000), (0.5, 20), (1.0, 50), (0.0, 7), (0.97, 500)])
def test_the_proportion_interval_is_scipys_wilson_interval(fraction, n):
    got = proportion_interval(fraction, n)
    ref = stats.binomtest(round(fraction * n), n).proportion_ci(confidence_level=0.95, method="wilson")
    assert (got.low, got.high) == (pytest.approx(ref.low, abs=1e-9), pytest.approx(ref.high, abs=1e-9))
    assert got.evidence()["n"] == n and got.mean == pytest.approx(round(fraction * n) / n)


def test_a_proportion_is_judged_against_a_line_like_an_interval():
    assert above(proportion_interval(0.8544, 10000), 0.85) == STRADDLES
    assert above(proportion_interval(0.88, 10000), 0.85) == HOLDS
    assert above(proportion_interval(0.80, 10000), 0.85) == FAILS
    # the same accuracy on a tenth of the images no longer clears the line
    assert above(proportion_interval(0.88, 500), 0.85) == STRADDLES
    with pytest.raises(ValueError, match="whole number of trials"):
        proportion_interval(0.5, 0)


def test_captions_name_the_runs_seeds_not_the_exploration_ones(repo):
    from hpcdl.platform.orchestration.captions import seeds

    cfg = load_config(repo / "configs" / "default.yaml")
    assert seeds(cfg["shuffle"], "shuffle") == ["shuffle.seeds 7, 8, 9", "shuffle.q_sweep_seeds 7",
                                                "shuffle.kakurenbo.seeds 10, 11, 12, 13, 14"]
    assert seeds(cfg["hpo"], "hpo") == ["hpo.seed 1"]
