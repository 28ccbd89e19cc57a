"""What a GPU machine without package registries needs from here, in one folder (`make gpu-carry`).

The GPU image has torch built for CUDA (and many of our dependencies) but not all of constraints.txt,
and no Fashion-MNIST. This writes into .gpu-carry/ (git-ignored):
  wheels/        every pin of constraints.txt the image lacks (envs/gpu_image_packages.txt), as wheels
                 for its Python (3.12, manylinux x86-64), without their dependencies (they are pinned too)
  sdists/        the pins published as source only that compile an extension (pycachesim): a wheel
                 built here would be for this machine's Python (3.11), which pip refuses there and which
                 would stop the whole install, so they are built on the GPU machine against its Python
  fashion-mnist/ the four IDX files, from the data directory given (Debian's dataset-fashion-mnist),
                 as xz (a device call carries at most 64 MiB with the repository; xz saves about 4 MiB
                 over the gzip files, which the 50 MiB cap of this folder needs)
There, `make gpu` installs the wheels into .gpu-carry/site, puts it on PYTHONPATH and unpacks the
data (envs/gpu_run.py).

    python envs/gpu_carry.py [--data DIR] [--python-version 3.12]
"""

from __future__ import annotations

import argparse
import gzip
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Pins the GPU run does without: ruff checks code here; PuLP (16 MiB, CBC binaries included) serves
# only Snakemake's ILP job scheduler, and the GPU run schedules with `--scheduler greedy`.
NOT_NEEDED = {"ruff", "pulp"}
# Needed on the GPU only, so in no requirements file of this CPU venv: the cuDNN frontend (μ-cuDNN's
# engines by id, hpcdl/studies/microbatch/cudnn/engines.py).
GPU_ONLY_PINS = ["nvidia-cudnn-frontend==1.32.0"]
CARRY_MAX_MIB = 50
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
FASHION_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(path: Path = ROOT / "envs" / "gpu_image_packages.txt") -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            names |= {norm(n) for n in line.split()}
    return names


def image_lacks(constraints: Path = ROOT / "constraints.txt") -> list[str]:
    """Every pin of constraints.txt the GPU image does not have, carried or not."""
    have = image_packages()
    pins = []
    for line in constraints.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and norm(line.split("==")[0]) not in have:
            pins.append(line)
    return pins


def missing_pins(constraints: Path = ROOT / "constraints.txt") -> list[str]:
    """The pins to carry: what the image lacks, less what the GPU run does without."""
    return [p for p in image_lacks(constraints) if norm(p.split("==")[0]) not in NOT_NEEDED]


def is_portable(wheel: Path) -> bool:
    """Whether a wheel installs on any CPython 3: pure Python, no ABI, any platform."""
    # packaging is imported where used: envs/gpu_run.py imports this module and needs only the stdlib
    from packaging.utils import parse_wheel_filename

    tags = parse_wheel_filename(wheel.name)[3]
    return all(t.abi == "none" and t.platform == "any" for t in tags) and any(
        t.interpreter.startswith("py3") for t in tags)


def carry_source_only(pip: list, pin: str, wheels: Path, sdists: Path) -> None:
    """A pure-Python wheel built here, or else the source archive, built on the GPU machine."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*pip, "wheel", "--no-deps", "-w", tmp, pin], check=True)
        built = next(Path(tmp).glob("*.whl"))
        if is_portable(built):
            shutil.copy2(built, wheels / built.name)
            return
    from packaging.utils import canonicalize_name, parse_wheel_filename

    name = canonicalize_name(pin.split("==")[0])
    for stale in [w for w in wheels.glob("*.whl") if parse_wheel_filename(w.name)[0] == name]:
        stale.unlink()  # an older carry's wheel for this machine's Python
    sdists.mkdir(parents=True, exist_ok=True)
    subprocess.run([*pip, "download", "--no-deps", "--no-binary=:all:", "-d", str(sdists), pin], check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / ".gpu-carry"))
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--python-version", default="3.12")
    args = ap.parse_args(argv)
    out = Path(args.out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    pip = [sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check"]
    for pin in [*missing_pins(), *GPU_ONLY_PINS]:
        got = subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version",
                              args.python_version, "--implementation", "cp", *platforms, "-d", str(wheels),
                              pin], capture_output=True, text=True)
        if got.returncode != 0:  # published as a source archive only
            carry_source_only(pip, pin, wheels, out / "sdists")
    data = out / "fashion-mnist"
    data.mkdir(exist_ok=True)
    for stale in [f for f in data.iterdir() if f.suffix != ".xz"]:  # an older carry's gzip files
        stale.unlink()
    for name in FASHION_FILES:
        found = [p for p in (Path(args.data) / f"{name}.gz", Path(args.data) / name) if p.exists()]
        if not found:
            print(f"error: {name}(.gz) not in {args.data}: install dataset-fashion-mnist or pass --data DIR",
                  file=sys.stderr)
            return 2
        target = data / f"{name}.xz"
        if not target.exists():
            opener = gzip.open if found[0].suffix == ".gz" else open
            with opener(found[0], "rb") as f:
                raw = f.read()
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
            os.replace(tmp, target)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and "site" not in f.parts) / 2**20
    n_sdists = len(list((out / "sdists").glob("*.tar.gz")))
    print(f"{out}: {len(list(wheels.glob('*.whl')))} wheels, {n_sdists} source archives and Fashion-MNIST, "
          f"{size:.1f} MiB")
    if size >= CARRY_MAX_MIB:
        print(f"error: {out} is {size:.1f} MiB, over the {CARRY_MAX_MIB} MiB a device call can carry beside "
              "the repository", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
