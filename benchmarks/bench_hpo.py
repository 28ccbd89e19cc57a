"""HPO study benchmarks, ratios measured in one run (never fails on timing):

1. grid throughput (trials/min) with 2 workers / 1 worker: the PDML'19 grid through the real
   driver and the local task backend;
2. driver overhead per trial (ask + submit + tell, journal storage) with instant in-process trials,
   and the per-trial runtime overhead of the grid runs (busy worker time not spent training);
3. one trial's training throughput (samples/s) / a plain PyTorch loop on the same model and batch.

    python benchmarks/bench_hpo.py [--config configs/default.yaml] [--csv PATH] [--skip-grid]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpcdl.platform.task_app import atomic_write_text, load_config  # noqa: E402
from hpcdl.studies.hpo import compute, driver, storage, sweep  # noqa: E402


def grid_throughput(cfg: dict, results: Path) -> list[dict]:
    import tasks.hpo as app
    from hpcdl.platform.task_app import (
        BACKEND,
        compss_wait_on,
        failure_reason,
        set_local_cores,
    )

    hpo = cfg["hpo"]
    import os

    os.environ[app.UNITS_ENV] = "1"
    data = compute.DataSpec(
        cfg["data"]["fashion_mnist_dir"],
        hpo["data"]["val_fraction"],
        hpo["seed"],
        hpo["data"]["train_limit"],
        hpo["data"]["test_limit"],
    )
    store = storage.open_storage(results / "bench-journal.log")
    rows, base = [], None
    for w in (1, 2):
        set_local_cores(w)
        compss_wait_on([app.warm_up(data) for _ in range(w)])
        p = [
            q
            for q in sweep.plan_studies({**hpo, "grid": {**hpo["grid"], "workers": [w]}}, BACKEND)
            if q.kind == "grid"
        ][0]
        t0 = time.perf_counter()
        study = driver.run_study(
            p, hpo, store, data, app.train_chunk, compss_wait_on, failure_reason, results
        )
        elapsed = time.perf_counter() - t0
        trained = sum(e["epoch_time_s"] for t in study.trials for e in t.user_attrs.get("epochs", []))
        rate = len(study.trials) / elapsed * 60
        print(f"[bench] grid, {w} worker(s): {len(study.trials)} trials, {elapsed:.1f} s", file=sys.stderr)
        base = base or rate
        rows.append(
            {
                "measure": f"grid trials/min, {w} worker(s)",
                "value": rate,
                "unit": "trials/min",
                "ratio": rate / base,
            }
        )
        rows.append(
            {
                "measure": f"grid runtime overhead per trial, {w} worker(s)",
                "value": 1000 * max(0.0, elapsed * w - trained) / len(study.trials),
                "unit": "ms",
                "ratio": float("nan"),
            }
        )
    return rows


def driver_overhead(cfg: dict, results: Path, n: int = 40) -> dict:
    hpo = cfg["hpo"]

    def submit(params, state, data, epochs, seed, fail):
        recs = [
            {"epoch": e + 1, "val_acc": 0.5, "train_loss": 1.0, "epoch_time_s": 0.0} for e in range(epochs)
        ]
        return {
            "state": {"epochs_done": epochs},
            "epochs_done": epochs,
            "records": recs,
            "start_time": 0.0,
            "end_time": 0.0,
            "worker": "inline",
        }

    p = sweep.StudyPlan("overhead", "search", "tpe", "none", n, 1, 1, hpo["space"]["epochs"]["high"])
    store = storage.open_storage(results / "overhead-journal.log")
    t0 = time.perf_counter()
    driver.run_study(p, hpo, store, None, submit, lambda f: f, lambda f: None, results)
    return {
        "measure": f"driver ask+submit+tell per trial (TPE, journal, {n} trials)",
        "value": 1000 * (time.perf_counter() - t0) / n,
        "unit": "ms",
        "ratio": float("nan"),
    }


def train_vs_plain(cfg: dict, repeats: int = 3) -> dict:
    """Samples/s of the study's train_epoch against a bare loop over contiguous batches, same model,
    optimizer and batch size; best of `repeats` each, interleaved so load changes hit both alike."""
    hpo = cfg["hpo"]
    torch.set_num_threads(1)
    data = compute.DataSpec(cfg["data"]["fashion_mnist_dir"], hpo["data"]["val_fraction"], hpo["seed"],
                          hpo["data"]["train_limit"], hpo["data"]["test_limit"])
    params = {**hpo["grid"]["fixed"], "optimizer": "adam", "lr": 1e-3, "batch_size": 64, "epochs": 1}
    x, y = compute.load_data(data)["train"]
    loss_fn = torch.nn.CrossEntropyLoss()

    def ours() -> float:
        model = compute.make_model(params)
        opt = compute.make_optimizer("adam", model, 1e-3)
        t0 = time.perf_counter()
        compute.train_epoch(model, opt, x, y, 64, seed=0, epoch=0)
        return time.perf_counter() - t0

    def plain() -> float:
        model = compute.make_model(params)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        model.train()
        t0 = time.perf_counter()
        for xb, yb in zip(x.split(64), y.split(64), strict=True):
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
        return time.perf_counter() - t0

    ours(), plain()  # warm-up (lazy torch imports)
    t_ours, t_plain = float("inf"), float("inf")
    for _ in range(repeats):
        t_ours, t_plain = min(t_ours, ours()), min(t_plain, plain())
    return {"measure": "trial training samples/s / plain PyTorch loop (same model, batch 64)",
            "value": len(y) / t_ours, "unit": "samples/s", "ratio": t_plain / t_ours}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="HPO study benchmarks")
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--csv", help="also write the table here")
    ap.add_argument("--skip-grid", action="store_true", help="skip the (minutes-long) grid throughput runs")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-hpo-") as tmp:
        tmp = Path(tmp)
        rows.append(train_vs_plain(cfg))
        rows.append(driver_overhead(cfg, tmp))
        if not args.skip_grid:
            rows += grid_throughput(cfg, tmp)
    width = max(len(r["measure"]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>10}  {'unit':<10}  ratio")
    for r in rows:
        print(f"{r['measure']:<{width}}  {r['value']:>10.2f}  {r['unit']:<10}  {r['ratio']:.3f}")
    if args.csv:
        lines = ["measure,value,unit,ratio"] + [
            f'"{r["measure"]}",{r["value"]:.6g},{r["unit"]},{r["ratio"]:.6g}' for r in rows
        ]
        atomic_write_text(args.csv, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
