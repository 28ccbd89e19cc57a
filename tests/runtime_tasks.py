"""Task functions the runtime tests submit (workers import them by module name)."""

import os
import time

from hpcdl.platform.orchestration.task_runtime import constraint, on_failure, task

# The decorator stacks are what the runtime tests exercise; the bodies they share live in helpers.


def _slept(seconds):
    start = time.time()
    time.sleep(seconds)
    return {"start": start, "end": time.time(), "pid": os.getpid()}


def _second_attempt(marker_path):
    # Succeeds on the second attempt only: the marker file remembers the first.
    if not os.path.exists(marker_path):
        open(marker_path, "w").close()
        raise OSError("transient failure")
    return "second attempt"


@constraint(computing_units="1")
@task(returns=1)
def sleep_one(seconds):
    return _slept(seconds)


@constraint(computing_units="2")
@task(returns=1)
def sleep_two(seconds):
    return _slept(seconds)


@constraint(computing_units="$HPCDL_TEST_UNITS")
@task(returns=1)
def units_from_env():
    import torch
    return torch.get_num_threads()


@task(returns=1)
def add(a, b):
    return a + b


@task(returns=2)
def pair(x):
    return x, x * 10


@on_failure(management="IGNORE", returns=-1)
@task(returns=1)
def fail_ignored(x):
    raise ValueError(f"bad point {x}")


@on_failure(management="FAIL")
@task(returns=1)
def fail_hard(x):
    raise RuntimeError(f"hard failure {x}")


@on_failure(management="RETRY")
@task(returns=1)
def fail_first_time(marker_path):
    return _second_attempt(marker_path)


@on_failure(management="RETRY")
@task(returns=1)
def always_fails():
    raise RuntimeError("permanent failure")


@task(returns=1)
def noop():
    return None


@task(returns=1)
def fail_first_time_no_decorator(marker_path):
    # No @on_failure: PyCOMPSs' default (RETRY) must give it a second attempt.
    return _second_attempt(marker_path)


def _held(seconds):
    return {**_slept(seconds), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


@constraint(processors=[{"processorType": "CPU", "computingUnits": "1"},
                        {"processorType": "GPU", "computingUnits": "$HPCDL_TEST_GPUS"}])
@task(returns=1)
def gpu_task(seconds):
    return _held(seconds)


@constraint(processors=[{"processorType": "CPU", "computingUnits": "1"},
                        {"processorType": "GPU", "computingUnits": "2"}])
@task(returns=1)
def two_gpu_task(seconds):
    return _held(seconds)


@constraint(computing_units="1")
@task(returns=1)
def cpu_task(seconds):
    return _held(seconds)
