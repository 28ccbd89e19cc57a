# The two set-up commands on a fresh machine (README): `make figures` and `make test`.
# Both create .venv if missing and install the pinned dependencies first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CORES ?= 2
CONFIG ?= configs/default.yaml
REPORT ?= results/report.html
FASHION_MNIST ?= /usr/share/datasets/fashion-mnist
export PATH := $(abspath $(VENV))/bin:$(PATH)
export MPLBACKEND := Agg

.PHONY: figures report test test-fast lint bench data browser tools clean gpu gpu-carry gpu-setup gpu-calibrate \
	gpu-tests gpu-studies

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
# probe) and a C compiler (hetmem compiles its kernels at run time), installed when missing and apt is usable; without valgrind the hetmem study says how to get it.
tools:
	@missing=""; command -v valgrind >/dev/null || missing="$$missing valgrind"; \
	command -v numactl >/dev/null || missing="$$missing numactl"; \
	command -v cc >/dev/null || missing="$$missing build-essential"; \
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

report: $(STAMP)
	snakemake --cores 1 --configfile $(CONFIG) --report $(REPORT)

test: $(STAMP) data browser tools
	pytest -m "" --durations=25 tests

test-fast: $(STAMP) data
	pytest -m "not slow and not slurm" tests

lint: $(STAMP)
	ruff check .
	snakemake --lint --configfile $(CONFIG)

bench: $(STAMP) data
	for b in benchmarks/bench_*.py; do python $$b || exit 1; done

# ---- the GPU (docs/architecture.md, "Devices") ----
# Every GPU step of the project, in order, on a machine with a CUDA GPU, run with that machine's own
# torch ($(GPU_PY); no venv: the CPU wheel of requirements.txt would replace its CUDA build). What the
# image lacks comes from `make gpu-carry`, run beforehand where PyPI is reachable (.gpu-carry/: wheels
# and Fashion-MNIST). `make gpu` = gpu-calibrate, gpu-tests, gpu-studies (every study under
# configs/gpu.yaml and its report), each also a target of its own that sets the machine up first, so
# a device lent in 10-minute calls runs `make gpu-calibrate gpu-tests` in one and `make gpu-studies`
# in the next (split by GPU_STUDIES over two calls where eight studies do not fit one). What must be committed afterwards lands in $(GPU_RECORDS)/; within a step a failure
# does not stop what follows (one call should show everything), and the step fails at its end.
# `--resources gpu=<GPUs here>`: no two GPU studies share a GPU at once (Snakemake caps a rule that
# asks for more, so one GPU runs them one after another).
GPU_PY ?= python3
GPU_RECORDS ?= gpu-records
# a subset of configs/gpu.yaml's studies for gpu-studies (e.g. GPU_STUDIES="spatial shuffle"), where
# all of them do not fit one call; empty: every study
GPU_STUDIES ?=
GPU_SELECT = $(if $(strip $(GPU_STUDIES)),--config 'studies=[$(subst $(eval) ,$(comma),$(strip $(GPU_STUDIES)))]')
comma := ,
GPU_CARRY ?= .gpu-carry
GPU_ENV = PATH="$(abspath .gpu-bin):$$PATH" PYTHONPATH="$(abspath $(GPU_CARRY))/site:$(CURDIR)" MPLBACKEND=Agg

gpu-carry: $(STAMP) data
	$(PY) envs/gpu_carry.py --out $(GPU_CARRY) --data $(FASHION_MNIST)

gpu: gpu-calibrate gpu-tests gpu-studies  # in this order (no -j)

gpu-setup:
	@$(GPU_PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "make gpu: torch sees no CUDA GPU here")'
	mkdir -p $(GPU_RECORDS) .gpu-bin
	ln -sfn "$$(command -v $(GPU_PY))" .gpu-bin/python
	if ls $(GPU_CARRY)/wheels/*.whl >/dev/null 2>&1; then \
	  $(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
	    --target $(GPU_CARRY)/site $(GPU_CARRY)/wheels/*.whl; fi
	if [ ! -e $(FASHION_MNIST)/train-images-idx3-ubyte.gz ] && [ -d $(GPU_CARRY)/fashion-mnist ]; then \
	  mkdir -p $(FASHION_MNIST) && cp $(GPU_CARRY)/fashion-mnist/* $(FASHION_MNIST)/; fi
	$(GPU_ENV) $(GPU_PY) -c 'from hpcdl.platform.device import cuda_record; import json; print(json.dumps(cuda_record(), indent=1))' \
	  | tee $(GPU_RECORDS)/device.json

# The spatial oracle's layer times at the papers' slab shapes (#26), into resources/calibration/
# (committed from there; the paper predictions of gpu-studies already read it). (The micro-batch
# cuDNN benchmark joins here.)
gpu-calibrate: gpu-setup
	mkdir -p $(GPU_RECORDS)/calibration
	$(GPU_ENV) $(GPU_PY) -m hpcdl spatial-calibrate --config configs/paper.yaml --device cuda \
	  --out resources/calibration 2>&1 | tee $(GPU_RECORDS)/spatial-calibrate.log; rc=$${PIPESTATUS[0]}; \
	cp resources/calibration/*.csv resources/calibration/*.provenance.json $(GPU_RECORDS)/calibration/ \
	  2>/dev/null || true; exit $$rc

gpu-tests: gpu-setup
	$(GPU_ENV) $(GPU_PY) -m pytest -m cuda -p no:cacheprovider -rs tests 2>&1 | tee $(GPU_RECORDS)/cuda-tests.log; \
	  exit $${PIPESTATUS[0]}

gpu-studies: gpu-setup
	rc=0; \
	$(GPU_ENV) $(GPU_PY) -m snakemake --cores all --configfile configs/gpu.yaml $(GPU_SELECT) --rerun-incomplete \
	  --resources gpu=$$(nvidia-smi -L | grep -c '^GPU') --keep-going --printshellcmds 2>&1 \
	  | tee $(GPU_RECORDS)/workflow.log; rc=$$((rc | $${PIPESTATUS[0]})); \
	$(GPU_ENV) $(GPU_PY) -m snakemake --cores 1 --configfile configs/gpu.yaml $(GPU_SELECT) \
	  --report $(GPU_RECORDS)/report.html >>$(GPU_RECORDS)/workflow.log 2>&1 || rc=1; \
	for d in results-gpu/*/; do s=$$(basename $$d); mkdir -p $(GPU_RECORDS)/$$s; \
	  cp $$d/claims.json $$d/tables/*.csv $$d/tables/*.provenance.json $(GPU_RECORDS)/$$s/ 2>/dev/null || true; done; \
	exit $$rc

clean:
	rm -rf results .snakemake
