"""The oracle at exactly the papers' settings: CosmoFlow and 3D U-Net, hybrid data x spatial on ABCI.

Oyama et al. train with the mini-batch split one sample per data group and each sample split
spatially over GPUs / mini-batch GPUs. For each published setting this predicts the paper's own
hybrid (the fastest depth x height split of that many spatial ranks) and the oracle's free pick
among every strategy it models, on the machine described in `spatial.machine` (public
specifications, no constant fitted to the published speedups). Model only: nothing is measured.
"""

from __future__ import annotations

from hpcdl.common.layers import build_spec, unet3d_spec
from hpcdl.studies.spatial.perfmodel.oracle import Machine, Strategy, family, predict, strategies


def network_spec(name: str, setting: dict, cosmoflow: dict) -> list[dict]:
    g = setting["grid"]
    if name == "cosmoflow":
        return build_spec((g, g, g), {"channels": cosmoflow["channels"], "kernel": cosmoflow["kernel"],
                                      "dense": cosmoflow["dense"]},
                          in_channels=cosmoflow["in_channels"], outputs=cosmoflow["outputs"])
    return unet3d_spec((setting["in_channels"], g, g, g), list(setting["levels"]), outputs=setting["outputs"])


def _splits(n: int) -> list[tuple[int, int]]:
    """Every (depth, height) split of n spatial ranks into powers of two."""
    out, d = [], 1
    while d <= n:
        if n % d == 0:
            out.append((d, n // d))
        d *= 2
    return out


def paper_predictions(block: dict) -> list[dict]:
    machine = Machine.from_description(block["machine"])
    rows = []
    for name, setting in block["papers"].items():
        spec = network_spec(name, setting, block["extrapolate"])
        batch = setting["batch_size"]
        _, d0, h0, _ = spec[0]["in"]
        max_model = min(L["cout"] for L in spec if L["kind"] == "conv")
        first = None
        for gpus in setting["gpus"]:
            if gpus % batch:
                raise ValueError(f"spatial.papers.{name}: {gpus} GPUs is not a multiple of the "
                                 f"mini-batch {batch}")
            split = gpus // batch
            paper = min((predict(spec, batch, Strategy(batch, pd, ph), machine) | {"depth": pd, "height": ph}
                         for pd, ph in _splits(split) if pd <= d0 and ph <= h0),
                        key=lambda r: r["total_s"])
            free = []
            for st in strategies(gpus, batch, d0, h0, max_model):
                pr = predict(spec, batch, st, machine)
                free.append((not pr["feasible"], pr["total_s"], st, pr))
            _, _, pick, pick_pr = min(free, key=lambda x: (x[0], x[1]))
            first = first or paper["total_s"]
            rows.append({"network": name, "grid": setting["grid"], "batch_size": batch, "gpus": gpus,
                         "spatial_split": split, "data": batch, "depth": paper["depth"],
                         "height": paper["height"], "time_per_iter_s": paper["total_s"],
                         "compute_s": paper["compute_s"], "halo_s": paper["halo_s"],
                         "allreduce_s": paper["allreduce_s"], "gather_s": paper["gather_s"],
                         "io_s": paper["io_s"],
                         "memory_gb": paper["memory_bytes"] / 1e9, "fits_in_memory": bool(paper["feasible"]),
                         "samples_per_s": batch / paper["total_s"],
                         "speedup_vs_first": first / paper["total_s"],
                         "ideal_speedup_vs_first": gpus / setting["gpus"][0],
                         "chosen_strategy": f"{pick.name} ({pick.data}x{pick.depth}x{pick.height}"
                                            f"{'' if pick.filter == 1 else f' f{pick.filter}'}"
                                            f"{'' if pick.channel == 1 else f' c{pick.channel}'})",
                         "chosen_family": family(pick), "chosen_time_per_iter_s": pick_pr["total_s"],
                         "chosen_fits_in_memory": bool(pick_pr["feasible"]),
                         "basis": "model (oracle), not measured"})
    return rows
