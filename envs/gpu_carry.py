"""What a GPU machine without package registries needs from here, in one folder (`make gpu-carry`).

The GPU image has torch built for CUDA (and many of our dependencies) but not all of constraints.txt,
and no Fashion-MNIST. This writes into .gpu-carry/ (git-ignored):
  wheels/        every pin of constraints.txt the image lacks (envs/gpu_image_packages.txt), as wheels
                 for its Python (3.12, manylinux x86-64), without their dependencies (they are pinned too)
  fashion-mnist/ the four IDX files, from the data directory given (Debian's dataset-fashion-mnist)
There, `make gpu` installs the wheels into .gpu-carry/site and puts it on PYTHONPATH.

    python envs/gpu_carry.py [--data DIR] [--python-version 3.12]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Tools of this machine's checks, not of the GPU run.
NOT_NEEDED = {"ruff"}
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


def missing_pins(constraints: Path = ROOT / "constraints.txt") -> list[str]:
    have = image_packages()
    pins = []
    for line in constraints.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and norm(line.split("==")[0]) not in have | NOT_NEEDED:
            pins.append(line)
    return pins


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
    for pin in missing_pins():
        got = subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version",
                              args.python_version, "--implementation", "cp", *platforms, "-d", str(wheels),
                              pin], capture_output=True, text=True)
        if got.returncode != 0:  # published as a source archive only: a pure-Python wheel built here
            subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), pin], check=True)
    data = out / "fashion-mnist"
    data.mkdir(exist_ok=True)
    for name in FASHION_FILES:
        found = [p for p in (Path(args.data) / f"{name}.gz", Path(args.data) / name) if p.exists()]
        if not found:
            print(f"error: {name}(.gz) not in {args.data}: install dataset-fashion-mnist or pass --data DIR",
                  file=sys.stderr)
            return 2
        shutil.copy2(found[0], data / found[0].name)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20
    print(f"{out}: {len(list(wheels.glob('*.whl')))} wheels and Fashion-MNIST, {size:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
