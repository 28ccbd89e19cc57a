"""Fit the oracle's machine constants from microbenchmark rows (pure numpy)."""

from __future__ import annotations

import numpy as np

from hpcdl.common.layers import family_of_key
from hpcdl.studies.spatial.perfmodel.machine import Machine


def fit_line(x, y) -> tuple[float, float]:
    """Least squares y = c0 + k x with c0, k >= 0 (falls back to a line through the origin)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) == 0:
        raise ValueError("calibration: no measurements to fit")
    if len(x) >= 2 and np.ptp(x) > 0:
        k, c0 = np.polyfit(x, y, 1)
        if k > 0 and c0 >= 0:
            return float(c0), float(k)
        if k > 0:
            # the large sizes set the slope; the intercept is what small sizes leave over it
            return float(max(0.0, np.median(y - k * x))), float(k)
    return float(np.mean(y)), 0.0


def fit_layer(x, y) -> tuple[float, ...]:
    """Per-layer-shape fit of fwd+bwd seconds against units: (c0, k) as fit_line, or, where the time
    grows faster than the size (the unconstrained line's intercept is negative: a larger slab
    spills out of the caches), (c0 < 0, k, floor) read as max(c0 + k u, floor u), which passes
    through the measured points and stays proportional (never negative) below the smallest.
    Clamping that intercept to zero instead over-predicted every whole-volume layer: the spatial
    study's 8 -> 16 channel conv at 48^2 took 2.7x, not 2x, the time of half its slab, and the
    oracle put one-rank runs 8-19 % above their measured time."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) >= 2 and np.ptp(x) > 0:
        k, c0 = np.polyfit(x, y, 1)
        if k > 0 and c0 < 0:
            smallest = x == x.min()
            return float(c0), float(k), float(y[smallest].mean() / x.min())
    return fit_line(x, y)


def proportional_below(fit: tuple, x) -> tuple[float, ...]:
    """A (c0, k) line with a positive intercept as (c0, k, rate, x_min): the line from the smallest
    timed size up, and below it that size's fitted time scaled down with the size (rate per unit).
    Two timed sizes' intercept (2 t(x/2) - t(x)) is the difference of two noisy times; extrapolated
    to a layer a sixteenth of the smallest timed one it was most of the prediction, and the
    calibration rounds disagreed by up to 20 % on the held-out 40^3 run (#40). Other fits (the
    superlinear (c0 < 0, k, floor), a flat or a proportional one) pass through unchanged."""
    x = np.asarray(x, float)
    if len(fit) != 2 or fit[0] <= 0 or fit[1] <= 0 or len(x) == 0 or x.min() <= 0:
        return fit
    c0, k = fit
    x_min = float(x.min())
    return float(c0), float(k), (c0 + k * x_min) / x_min, x_min


def _concurrent(row: dict) -> int:
    """Ranks that ran a compute row at once (1: alone; rows without the column are alone)."""
    c = row.get("concurrent")
    return 1 if c is None or c != c else int(c)


def _compute_fits(rows: list[dict], families: bool = True, proportional: bool = True) -> dict:
    """Per-kind and per-layer-shape linear fits (c0 + units * k) of fwd+bwd / optimizer timings;
    `proportional`: the per-shape, per-family and optimizer fits price sizes below their smallest
    timed one by proportional_below (spatial.below_timed)."""
    by = {}
    for r in rows:
        by.setdefault(r["kind"], []).append(r)
    out = {}
    for kind in ("conv", "pool", "dense", "optimizer", "fault"):
        rs = by.get(kind, [])
        out[kind] = fit_line([r["units"] for r in rs], [r["time_s"] for r in rs]) if rs else (0.0, 0.0)
    if proportional and by.get("optimizer"):
        out["optimizer"] = proportional_below(out["optimizer"], [r["units"] for r in by["optimizer"]])
    out["layers"] = _keyed_fits(by, lambda key: key, proportional)
    # one family's rows span its timed in-plane sizes; a family timed at one size only fits as that shape
    out["families"] = _keyed_fits(by, family_of_key, proportional) if families else {}
    return out


def _keyed_fits(by: dict, group, proportional: bool = True) -> dict:
    """fit_layer of the conv/pool/dense rows grouped by group(layer_key)."""
    fits = {}
    for kind in ("conv", "pool", "dense"):
        groups = {}
        for r in by.get(kind, []):
            if isinstance(r.get("key"), str):
                groups.setdefault(group(r["key"]), []).append(r)
        for key, rs in sorted(groups.items()):
            units = [r["units"] for r in rs]
            fitted = fit_layer(units, [r["time_s"] for r in rs])
            if proportional:
                fitted = proportional_below(fitted, units)
            if fitted[1] > 0 or len(rs) == 1:
                fits[key] = fitted if fitted[1] > 0 else (0.0, rs[0]["time_s"] / max(rs[0]["units"], 1))
    return fits


def fit_machine(rows: list[dict], cores: int, threads_per_rank: int = 1, overlap: bool = False,
                families: bool = True, proportional: bool = True) -> tuple[Machine, dict]:
    """Machine for the laptop runs (every rank on this host: intra = inter) and the fitted constants.
    `families`: price a layer shape without its own fit by its family's fit (spatial.shape_fallback);
    `proportional`: a size below the smallest timed one scales that size's time (spatial.below_timed)."""
    by = {}
    for r in rows:
        by.setdefault(r["kind"], []).append(r)

    def fit(kind, xkey="units"):
        rs = by.get(kind, [])
        return fit_line([r[xkey] for r in rs], [r["time_s"] for r in rs])

    alpha, beta = fit("pingpong", "size_bytes") if "pingpong" in by else (0.0, 0.0)
    # ring on p ranks: 2(p-1) alpha + 2(p-1)/p n beta; at p = 2: 2 alpha + n beta
    ar = fit("allreduce", "size_bytes") if "allreduce" in by else None
    allreduce_ab = (ar[0] / 2, ar[1]) if ar else None
    # all-gather of n total bytes on p ranks: (p-1) alpha + (p-1)/p n beta; at p = 2: alpha + n/2 beta
    ag = fit("allgather", "size_bytes") if "allgather" in by else None
    allgather_ab = (ag[0], 2 * ag[1]) if ag else None
    exchange_ab = fit("exchange", "size_bytes") if "exchange" in by else None
    io_rows = by.get("io", [])
    io_c, io_k = fit_line([r["units"] for r in io_rows], [r["time_s"] for r in io_rows])
    batch = io_rows[0]["batch"] if io_rows else 1
    solo, busy = _compute_fits([r for r in rows if _concurrent(r) <= 1], families, proportional), None
    together = [r for r in rows if _concurrent(r) > 1]
    if together:
        busy = _compute_fits(together, families, proportional)
        busy["ranks"] = max(_concurrent(r) for r in together)
        busy.pop("fault")  # measured, not charged (below)
    m = Machine(conv=solo["conv"], pool=solo["pool"], dense=solo["dense"], optimizer=solo["optimizer"],
                io=(io_c / batch, io_k), alpha_intra=alpha, beta_intra=beta, alpha_inter=alpha,
                beta_inter=beta, ranks_per_node=10 ** 6, cores=cores, threads_per_rank=threads_per_rank,
                layers=solo["layers"], families=solo["families"], im2col=True, allreduce_ab=allreduce_ab,
                allgather_ab=allgather_ab, exchange_ab=exchange_ab, busy=busy, overlap=overlap)
    # The "fault" rows (map + first-touch + unmap of fresh pages) are fitted and reported, not
    # charged: ranks run with hpcdl.platform.kit.rank_runtime.launch.RANK_MALLOC_ENV, so after the first step
    # they reuse their heap and take no fresh pages. They price what glibc's defaults would cost a step
    # (fresh_bytes() of new pages; launch with keep_heap=False to see it).
    consts = {"alpha_s": alpha, "beta_s_per_byte": beta,
              "bandwidth_gbs": (1 / beta / 1e9) if beta > 0 else float("inf"),
              "conv_gflops": (3 / m.conv[1] / 1e9) if m.conv[1] > 0 else float("inf"),
              "conv_overhead_s": m.conv[0], "pool_overhead_s": m.pool[0],
              "optimizer_overhead_s": m.optimizer[0], "cores": cores,
              "fault_gbs": (1 / solo["fault"][1] / 1e9) if solo["fault"][1] > 0 else None,
              "layer_fits": len(m.layers), "family_fits": len(m.families),
              "busy_layer_fits": len(busy["layers"]) if busy else 0,
              "superlinear_layer_fits": sum(len(f) == 3 for f in m.layers.values()),
              "proportional_below_fits": sum(len(f) == 4 for f in (*m.layers.values(), *m.families.values())),
              "busy_conv_gflops": (3 / busy["conv"][1] / 1e9) if busy and busy["conv"][1] > 0 else None,
              "allreduce_alpha_s": allreduce_ab[0] if allreduce_ab else None,
              "allreduce_beta_s_per_byte": allreduce_ab[1] if allreduce_ab else None,
              "exchange_c0_s": exchange_ab[0] if exchange_ab else None,
              "exchange_s_per_byte": exchange_ab[1] if exchange_ab else None}
    return m, consts
