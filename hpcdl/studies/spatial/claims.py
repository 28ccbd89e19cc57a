"""Claims stage of the spatial study: tables/ (+ raw/runs.csv for why a run is missing) ->
the six claims (exactness, 2-rank efficiency against the ceiling, the oracle's error on each held-out
run, loss, the oracle's pick among every strategy family, the oracle's compute term on a GPU)."""

from __future__ import annotations

from pathlib import Path

from hpcdl.platform import StudyDir, confirmed_on, deterministic, read_or_empty, read_tables, unseeded
from hpcdl.studies.spatial.claim_families.gpu_compute import calibration_source, claim_compute_term
from hpcdl.studies.spatial.claim_families.model import claim_exact, claim_loss
from hpcdl.studies.spatial.claim_families.oracle import claim_oracle_error, claim_pick
from hpcdl.studies.spatial.claim_families.runs import one_gpu_rule
from hpcdl.studies.spatial.claim_families.scaling import claim_efficiency
from hpcdl.studies.spatial.sweep import expand as expand_runs

CLAIMS = ("partitioned_exact", "strong_efficiency_2", "oracle_error", "loss_falls", "oracle_picks_spatial",
          "compute_term")
# judged per held-out run on the interval of its per-repeat errors (tables/oracle_repeats.csv); the
# efficiency per 2-rank layout on the interval of its per-repeat efficiencies (tables/repeat_times.csv)
INTERVAL_CLAIMS = ("strong_efficiency_2", "oracle_error", "oracle_picks_spatial")
CONFIRMATION = {
    "partitioned_exact": deterministic("the partitioned model equals the whole one in float64 on every "
                                       "configured layout, whatever the seed"),
    "strong_efficiency_2": unseeded("iteration times of this run's strong and ceiling runs, measured afresh: "
                                    "the seed draws the fields, not the timings"),
    "oracle_error": unseeded("this run's iteration and microbenchmark times, measured afresh: the seed draws "
                             "the fields, not the timings"),
    "loss_falls": confirmed_on("seed"),
    "oracle_picks_spatial": unseeded("the pick is the oracle's arithmetic on the configured machine; its "
                                     "trust rests on this run's timings (oracle_error)"),
    # the claim replaces this with its calibration's own source where it can tell (calibration_source)
    "compute_term": unseeded("GPU times of a calibration: this run's own, measured afresh, or a committed "
                             "resources/calibration/<gpu>.csv, not measured in this run"),
}


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    block = cfg["spatial"]
    df, exact, loss, ext, check, repeats, fit, rep_times = read_tables(
        study_dir, "runs", "exactness", "loss", "extrapolation", "compute_check", "oracle_repeats",
        "calibration_fit", "repeat_times")
    raw = read_or_empty(StudyDir(study_dir).raw_table("runs"))
    runs = [r for r in dict.fromkeys(p["run"] for p in expand_runs(block))]
    timed = {r: float(df.loc[df["run"] == r, "time_per_iter_s"].iloc[0]) for r in runs
             if "run" in df and (df["run"] == r).any()}
    gpus = one_gpu_rule(study_dir, df)
    oracle, oracle_holds = claim_oracle_error(block, df, raw, repeats, fit,
                                              [r for r in runs if not r.startswith("ceiling")], gpus)
    return [claim_exact(block, exact),
            claim_efficiency(block, df, raw, timed, rep_times, gpus),
            oracle,
            claim_loss(block, loss, raw, runs),
            claim_pick(block, ext, oracle, oracle_holds),
            claim_compute_term(block, check, calibration_source(cfg, study_dir, check))]
