"""The spatial study's results beside Oyama et al.'s and Kahira et al.'s published ones
(resources/papers.yaml; the rows are built by hpcdl.platform.orchestration.paper_vs_ours).

The papers' speedups were measured on 256-2048 V100 GPUs; this study times a few ranks of one machine,
so those rows cannot be reproduced here and set the oracle's prediction at exactly the papers' settings
(tables/paper_predictions.csv, hpcdl.studies.spatial.paper_scale) beside them. The oracle's accuracy is
comparable: ours is 1 - its mean |error| on this run's held-out runs (claim oracle_error), and the row
rests on that claim: a straddling or failing oracle_error caps it, whatever the mean.
"""

from __future__ import annotations

from hpcdl.platform import Ours, RunFiles

CLUSTER = ("needs {gpus} V100 GPUs training {net} on {grid}^3 samples (ABCI); this study times at most a "
           "few ranks of one machine")


def _prediction(network: str, gpus: int):
    def oracle(run: RunFiles) -> dict | None:
        t = run.table("paper_predictions")
        if t.empty or not {"network", "gpus", "speedup_vs_first"} <= set(t):
            return None
        mine = t[t["network"].astype(str).eq(network)]
        row = mine[mine["gpus"].astype(int).eq(gpus)]
        if row.empty:
            return None
        r = row.iloc[0]
        return {"value": float(r["speedup_vs_first"]),
                "setting": f"oracle, {gpus} vs {int(mine['gpus'].min())} GPUs, compute basis "
                           f"{r.get('compute_basis', '?')} ({r.get('compute_gpu', '?')})"}
    return oracle


def _accuracy(run: RunFiles) -> dict | None:
    found = run.claims_named("oracle_error")
    if not found:
        return None
    c = found[0]
    if c["status"] == "not_measured":
        return {"missing": c.get("reason", "oracle_error not measured")}
    m = c.get("measured", {})
    if m.get("mean_accuracy") is None:
        return {"missing": "claim oracle_error has no mean_accuracy"}
    return {"value": float(m["mean_accuracy"]),
            "setting": "1 - mean |error| of the oracle on the held-out runs "
                       + ", ".join(m.get("held_out", []))}


PAPER = {
    "cosmoflow_strong_512_to_2048": Ours(
        "tables/paper_predictions.csv (the oracle only)",
        unreproducible=CLUSTER.format(gpus="512-2048", net="CosmoFlow", grid=512),
        oracle=_prediction("cosmoflow", 2048)),
    "unet_strong_256_to_512": Ours(
        "tables/paper_predictions.csv (the oracle only)",
        unreproducible=CLUSTER.format(gpus="256-512", net="3D U-Net", grid=256),
        oracle=_prediction("unet3d", 512)),
    # accuracy: at or above the paper's counts as within; 10 % below it still does
    "oracle_accuracy": Ours("claim oracle_error: measured mean_accuracy", value=_accuracy, tolerance=0.10,
                            better="higher", rests_on=("oracle_error",)),
    "lbann_settings": Ours("spatial config", context=(
        "ours: a CosmoFlow-like network in PyTorch, Adam at spatial.lr, depth x height splits from "
        "spatial.strong / weak / hybrid layouts, not LBANN")),
}
