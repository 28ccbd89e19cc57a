# The two set-up commands on a fresh machine (README): `make figures` and `make test`.
# Both create .venv if missing and install the pinned dependencies first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CORES ?= 2
CONFIG ?= configs/default.yaml
REPORT ?= results/report.html
REPORT_CSS := workflows/report/report.css
FASHION_MNIST ?= /usr/share/datasets/fashion-mnist
export PATH := $(abspath $(VENV))/bin:$(PATH)
export MPLBACKEND := Agg

.PHONY: figures report test test-fast lint bench data browser tools clean gpu gpu-carry gpu-setup gpu-calibrate \
	gpu-tests gpu-studies gpu-plan gpu-smoke

$(STAMP): requirements.txt constraints.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -c constraints.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

# Fashion-MNIST from Debian's package, installed when missing and apt is usable.
data:
	@if [ ! -e $(FASHION_MNIST)/train-images-idx3-ubyte.gz ] && [ ! -e $(FASHION_MNIST)/train-images-idx3-ubyte ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing dataset-fashion-mnist with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; \
	  else \
	    echo "Fashion-MNIST is not in $(FASHION_MNIST): run 'sudo apt-get install dataset-fashion-mnist'" \
	         "or set data.fashion_mnist_dir in your config to a directory holding the four IDX files" >&2; \
	  fi; \
	fi

# Headless Chromium (Debian's package) for the report test (tests/test_report.py), installed when
# missing and apt is usable; without it that test skips (fails under CI=true).
browser:
	@if ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else \
	    echo "chromium is not installed: run 'sudo apt-get install chromium' to test the report in a browser" >&2; \
	  fi; \
	fi

# Debian tools the studies drive: valgrind (hetmem's memory-access traces), numactl (hetmem's NUMA
# probe), a C compiler (hetmem compiles its kernels at run time) and fio (checkpoint's storage
# ceiling), installed when missing and apt is usable; without valgrind the hetmem study says how to
# get it, without fio the checkpoint study's bandwidth claim is not measured and says so.
tools:
	@missing=""; command -v valgrind >/dev/null || missing="$$missing valgrind"; \
	command -v numactl >/dev/null || missing="$$missing numactl"; \
	command -v cc >/dev/null || missing="$$missing build-essential"; \
	command -v fio >/dev/null || missing="$$missing fio"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing$$missing with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "missing$$missing: run 'sudo apt-get install$$missing'" >&2; \
	  fi; \
	fi

figures: $(STAMP) data tools
	snakemake --cores $(CORES) --configfile $(CONFIG) --rerun-incomplete --printshellcmds
	$(MAKE) report

# The report's stylesheet (workflows/report/report.css) fits every view to the window.
report: $(STAMP)
	snakemake --cores 1 --configfile $(CONFIG) --report $(REPORT) --report-stylesheet $(REPORT_CSS)

# Two pytest-xdist workers, a test file each at a time (--dist loadfile): the Slurm tests share one
# cluster, so their file stays on one worker. The files that read the test-scale workflow run are
# one unit, run first (--no-loadscope-reorder) on one worker, which makes that run once
# (tests/workflow_run.py), so no test reads a run another worker is changing.
TEST_WORKERS ?= 2
test: $(STAMP) data browser tools
	pytest -m "" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests

test-fast: $(STAMP) data
	pytest -m "not slow and not slurm" tests

lint: $(STAMP)
	ruff check .
	snakemake --lint --configfile $(CONFIG)

bench: $(STAMP) data
	for b in benchmarks/bench_*.py; do python $$b || exit 1; done

# ---- the GPU (docs/architecture.md, "Devices") ----
# Every GPU step of the project in one device call of at most 9 minutes, each step under its own
# limit, ending in one archive $(GPU_RECORDS).tgz (envs/gpu_run.py; `make gpu-plan` prints the step
# budget). Run with that machine's own torch ($(GPU_PY), reached through a wrapper script; no venv: the
# CPU wheel of requirements.txt would replace its CUDA build). What the image lacks comes from `make
# gpu-carry`, run beforehand where PyPI is reachable (.gpu-carry/: wheels and Fashion-MNIST, < 50 MiB).
# `make gpu-studies` runs the studies the first call had no time for (GPU_STUDIES="a b": a subset),
# into $(GPU_RECORDS)-studies: each call starts its records folder afresh, so the first call's stay.
# `make gpu-smoke` proves the same plumbing on this CPU, and CI runs it (tests/test_gpu_smoke.py).
GPU_PY ?= python3
GPU_RECORDS ?= gpu-records
GPU_STUDIES ?=
GPU_STEPS ?= setup,tests,engines,calibrate,studies
GPU_CALL_BUDGET ?= 540
GPU_CARRY ?= .gpu-carry
GPU_SMOKE_STUDIES ?= microbatch
GPU_RUN = python3 envs/gpu_run.py --python $(GPU_PY) --records $(GPU_RECORDS) --carry $(GPU_CARRY) \
	--fashion-mnist $(FASHION_MNIST) --call-budget-s $(GPU_CALL_BUDGET)

gpu-carry: $(STAMP) data
	$(PY) envs/gpu_carry.py --out $(GPU_CARRY) --data $(FASHION_MNIST)

gpu:
	$(GPU_RUN) --steps $(GPU_STEPS) --studies "$(GPU_STUDIES)"

gpu-plan:
	python3 envs/gpu_run.py --plan --steps $(GPU_STEPS) --studies "$(GPU_STUDIES)" --call-budget-s $(GPU_CALL_BUDGET)

gpu-setup:
	$(GPU_RUN) --steps setup

gpu-calibrate:
	$(GPU_RUN) --steps setup,calibrate

gpu-tests:
	$(GPU_RUN) --steps setup,tests

gpu-studies:
	$(GPU_RUN) --steps setup,studies --studies "$(GPU_STUDIES)" --records $(GPU_RECORDS)-studies

gpu-smoke: $(STAMP) data
	$(PY) envs/gpu_run.py --smoke --records $(GPU_RECORDS)-smoke --fashion-mnist $(FASHION_MNIST) \
	  --studies "$(GPU_SMOKE_STUDIES)"

clean:
	rm -rf results .snakemake
