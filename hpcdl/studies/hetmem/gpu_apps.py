"""The CUDA path's mini-apps: the CPU kernels' algorithms written in torch, with named objects.

Each app: build(scale) -> (objects {name: CPU tensor}, step(objs) running the kernel once, bytes
each object moves per step counted from the step's operations: the estimator's access shares).
torch is imported inside each builder, so importing this module needs no torch.
"""

from __future__ import annotations

import numpy as np


def _stream(scale):
    import torch

    n = max(1024, int(2**24 * scale))
    objs = {
        "a": torch.zeros(n, dtype=torch.float64),
        "b": torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1)),
        "c": torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(2)),
    }

    def step(o):  # a = b + 3c: one read of b and c, one write of a
        torch.add(o["b"], o["c"], alpha=3.0, out=o["a"])

    return objs, step, {k: 8 * n for k in objs}


def _stencil(scale):
    import torch

    n = max(16, int(192 * scale ** (1 / 3)))
    objs = {"u": torch.rand(n, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(1)),
            "v": torch.zeros(n, n, n, dtype=torch.float64)}

    def sweep(u, v):
        c = slice(1, -1)
        v[c, c, c] = 0.4 * u[c, c, c] + 0.1 * (
            u[:-2, c, c] + u[2:, c, c] + u[c, :-2, c] + u[c, 2:, c] + u[c, c, :-2] + u[c, c, 2:]
        )

    def step(o):  # two sweeps: u -> v -> u, so both grids play both roles
        sweep(o["u"], o["v"])
        sweep(o["v"], o["u"])

    # per sweep the source is read by 7 slices and the target written once: 8 grid passes per grid
    return objs, step, {"u": 8 * n**3 * 8, "v": 8 * n**3 * 8}


def _cg(scale):
    import torch

    m = max(32, int(1024 * scale**0.5))
    n = m * m
    g = torch.arange(n)
    gy, gx = g // m, g % m
    rows, cols = [g], [g]
    for ok, nb in ((gx > 0, g - 1), (gx < m - 1, g + 1), (gy > 0, g - m), (gy < m - 1, g + m)):
        rows.append(g[ok])
        cols.append(nb[ok])
    rows, cols = torch.cat(rows), torch.cat(cols)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))  # irregular gathers, as on the CPU
    rows, cols = perm[rows], perm[cols]
    vals = torch.where(rows == cols, 4.0, -1.0).to(torch.float64)
    order = torch.argsort(rows * n + cols)
    rows, cols, vals = rows[order], cols[order], vals[order]
    rowptr = torch.zeros(n + 1, dtype=torch.int64)
    rowptr[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
    objs = {
        "rowptr": rowptr,
        "colidx": cols.to(torch.int64),
        "values": vals,
        "x": torch.zeros(n, dtype=torch.float64),
        "r": torch.ones(n, dtype=torch.float64),
        "p": torch.ones(n, dtype=torch.float64),
        "q": torch.zeros(n, dtype=torch.float64),
    }

    def step(o):  # one CG iteration on A x = 1 from x = 0
        a = torch.sparse_csr_tensor(o["rowptr"], o["colidx"], o["values"], size=(n, n),
                                    check_invariants=False)
        o["q"].copy_(torch.mv(a, o["p"]))
        rr = torch.dot(o["r"], o["r"])
        alpha = rr / torch.dot(o["p"], o["q"])
        o["x"].add_(alpha * o["p"])
        o["r"].sub_(alpha * o["q"])
        beta = torch.dot(o["r"], o["r"]) / rr
        o["p"].mul_(beta).add_(o["r"])

    nnz = len(cols)
    moved = {
        "rowptr": 8 * n,
        "colidx": 8 * nnz,
        "values": 8 * nnz,
        "p": 8 * nnz + 8 * n * 5,  # gathered once per nonzero, then dot, axpy and the update
        "q": 8 * n * 3,
        "x": 16 * n,
        "r": 8 * n * 6,
    }
    return objs, step, moved


def _gups(scale):
    import torch

    log2 = max(16, int(np.log2(2**26 * scale)))
    n, updates = 2**log2, 2 ** (log2 - 2)
    g = torch.Generator().manual_seed(0)
    objs = {
        "table": torch.arange(n, dtype=torch.int64),
        "ran": torch.randint(0, 2**62, (updates,), generator=g, dtype=torch.int64),
    }

    def step(o):  # table[ran & (n-1)] ^= ran
        idx = o["ran"] & (n - 1)
        o["table"].index_put_((idx,), o["table"][idx] ^ o["ran"])

    return objs, step, {"table": 16 * updates, "ran": 16 * updates}


def _mlp(scale):
    import torch

    b, i, h, k = 256, 1024, max(64, int(4096 * scale**0.5)), 256
    g = torch.Generator().manual_seed(0)
    objs = {
        "inputs": torch.rand(b, i, generator=g),
        "targets": torch.rand(b, k, generator=g),
        "w1": torch.randn(i, h, generator=g) * 0.01,
        "w2": torch.randn(h, k, generator=g) * 0.01,
        "hidden": torch.zeros(b, h),
        "grad_hidden": torch.zeros(b, h),
        "grad_w1": torch.zeros(i, h),
        "grad_w2": torch.zeros(h, k),
        "outputs": torch.zeros(b, k),
    }

    def step(o):  # forward, squared-error gradient, backward, SGD update, all into named objects
        torch.matmul(o["inputs"], o["w1"], out=o["hidden"])
        o["hidden"].clamp_(min=0)
        torch.matmul(o["hidden"], o["w2"], out=o["outputs"])
        o["outputs"].sub_(o["targets"])
        torch.matmul(o["hidden"].T, o["outputs"], out=o["grad_w2"])
        torch.matmul(o["outputs"], o["w2"].T, out=o["grad_hidden"])
        o["grad_hidden"].mul_(o["hidden"] > 0)
        torch.matmul(o["inputs"].T, o["grad_hidden"], out=o["grad_w1"])
        o["w1"].sub_(0.01 * o["grad_w1"])
        o["w2"].sub_(0.01 * o["grad_w2"])

    # operations that read or write each object in one step (each moves the whole object once)
    uses = {"inputs": 2, "targets": 1, "w1": 3, "w2": 4, "hidden": 6, "grad_hidden": 4, "grad_w1": 2,
            "grad_w2": 2, "outputs": 5}
    return objs, step, {name: uses[name] * v.numel() * 4 for name, v in objs.items()}


APPS = {"stream": _stream, "stencil": _stencil, "cg": _cg, "gups": _gups, "mlp": _mlp}
