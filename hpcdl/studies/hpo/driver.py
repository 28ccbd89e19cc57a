"""The ask-and-tell loop: Optuna in the main program, each trial's epoch chunks as tasks.

The task runtime is injected (`submit`, `wait`, `reason`), so this module stays free of
workflow code and runs with PyCOMPSs, the local backend, or plain function calls in tests.

compss_wait_on blocks, so the driver keeps a FIFO of in-flight chunk futures: it fills the FIFO
up to `max_in_flight` trials, waits on the oldest, reports its epochs to Optuna, asks the pruner,
and submits that trial's next chunk (or a new trial) before waiting on the next oldest. Tasks
behind the oldest keep running meanwhile, and results are handled in submission order, so
sampler and pruner decisions do not depend on which worker happened to finish first.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from hpcdl.platform import HostLoad
from hpcdl.studies.hpo.space import (
    grid_distributions,
    grid_params,
    make_pruner,
    make_sampler,
    search_distributions,
)
from hpcdl.studies.hpo.storage import best_state_path, counted, load_best, recover_interrupted, save_best
from hpcdl.studies.hpo.sweep import StudyPlan

Submit = Callable[..., Any]  # (params, state, data, epochs, seed, fail) -> future
Wait = Callable[[Any], Any]  # future -> chunk result dict (or None when the task failed)
Reason = Callable[[Any], "str | None"]  # future -> why it failed


@dataclass
class _Flight:
    trial: optuna.Trial
    params: dict
    future: Any
    epochs: list = field(default_factory=list)


def _log(msg: str) -> None:
    print(f"[hpo] {msg}", file=sys.stderr, flush=True)


def _distributions(plan: StudyPlan, hpo: dict):
    return grid_distributions(hpo["grid"]) if plan.sampler == "grid" else search_distributions(hpo["space"])


def _full_params(plan: StudyPlan, hpo: dict, sampled: dict) -> dict:
    if plan.sampler == "grid":
        return grid_params(hpo["grid"], sampled)
    return {k: (int(v) if k in ("batch_size", "width", "depth", "epochs") else v) for k, v in sampled.items()}


def create_study(plan: StudyPlan, hpo: dict, storage) -> optuna.Study:
    max_epochs = max(hpo["grid"]["epochs"]) if plan.sampler == "grid" else hpo["space"]["epochs"]["high"]
    sampler = make_sampler(plan.sampler, int(hpo["seed"]), grid=hpo["grid"],
                           tpe_startup_trials=int(hpo["tpe_startup_trials"]))
    pruner = make_pruner(plan.pruner, hpo["pruner_options"], int(max_epochs))
    study = optuna.create_study(study_name=plan.name, storage=storage, sampler=sampler, pruner=pruner,
                                direction="maximize", load_if_exists=True)
    if "plan" not in study.user_attrs:
        study.set_user_attr("plan", {k: getattr(plan, k) for k in plan.__dataclass_fields__})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["val_acc"])  # shown by optuna-dashboard
    return study


def run_study(plan: StudyPlan, hpo: dict, storage, data, submit: Submit, wait: Wait, reason: Reason,
              study_dir: Path, host_load: bool = True) -> optuna.Study:
    """Run (or continue) one study until `plan.n_trials` trials have finished; return it.

    With `host_load` (the workers are this process's descendants: the local backend, or tasks run
    inline) the session records the host's other load while it ran (hpcdl.platform's HostLoad), which
    the grid's timing claim leaves a disturbed repeat out by; under COMPSs the workers are the runtime's
    processes, not ours, so the load cannot be told from the run's and is not recorded."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = create_study(plan, hpo, storage)
    marked = recover_interrupted(study)
    if marked:
        _log(f"{plan.name}: trials {marked} were in flight when the previous driver stopped: "
             "marked FAIL, replacements queued")
    sessions = list(study.user_attrs.get("sessions", []))
    session = {"pid": os.getpid(), "start": time.time()}
    study.set_user_attr("sessions", [*sessions, session])
    load = HostLoad().start() if host_load else None
    _AskAndTell(plan, hpo, study, data, submit, study_dir).run(wait, reason, session["pid"])
    session["end"] = time.time()
    if load is not None:
        session["host_load"] = load.stop()
    study.set_user_attr("sessions", [*sessions, session])
    return study


class _AskAndTell:
    """One driver session's loop: a FIFO of in-flight trial chunks, handled in submission order."""

    def __init__(self, plan: StudyPlan, hpo: dict, study: optuna.Study, data, submit: Submit,
                 study_dir: Path):
        self.plan, self.hpo, self.study, self.data, self.submit = plan, hpo, study, data, submit
        self.dists = _distributions(plan, hpo)
        self.finished = sum(counted(t) for t in study.get_trials(deepcopy=False))
        self.to_ask = max(0, plan.n_trials - self.finished)
        if self.to_ask == 0:
            _log(f"{plan.name}: already has {self.finished} finished trials, nothing to run")
        self.best_path = best_state_path(study_dir, plan.name)
        best = load_best(self.best_path)
        self.best_value = best["value"] if best else float("-inf")
        self.fail_trials = set(hpo.get("fail_trials", []))
        self.seed = int(hpo["seed"])
        self.inflight: deque[_Flight] = deque()

    def run(self, wait: Wait, reason: Reason, pid: int) -> None:
        while self.to_ask > 0 or self.inflight:
            while self.to_ask > 0 and len(self.inflight) < self.plan.max_in_flight:
                self._ask(pid)
            fl = self.inflight.popleft()
            res = wait(fl.future)
            if res is None:
                self._finish(fl, TrialState.FAIL, why=reason(fl.future) or "task failed without a reason")
            elif "error" in res:
                self._finish(fl, TrialState.FAIL, why=res["error"])
            else:
                self._tell(fl, res)

    def _ask(self, pid: int) -> None:
        trial = self.study.ask(self.dists)
        trial.set_user_attr("n_params", len(trial.params))
        trial.set_user_attr("session_pid", pid)
        params = _full_params(self.plan, self.hpo, trial.params)
        if self.plan.sampler == "grid":
            fixed = {k: v for k, v in params.items() if k not in trial.params}
            trial.set_user_attr("fixed_params", fixed)
        self._submit_chunk(_Flight(trial, params, None), None)
        self.to_ask -= 1

    def _submit_chunk(self, fl: _Flight, state) -> None:
        epochs = min(self.plan.chunk_epochs, fl.params["epochs"] - len(fl.epochs))
        fail = state is None and fl.trial.number in self.fail_trials
        fl.future = self.submit(fl.params, state, self.data, epochs, self.seed, fail)
        self.inflight.append(fl)

    def _tell(self, fl: _Flight, res: dict) -> None:
        """A chunk's epochs reported to Optuna; then the trial completes, is pruned, or goes on."""
        for rec in res["records"]:
            rec = {**rec, "worker": res["worker"], "chunk_start": res["start_time"],
                   "chunk_end": res["end_time"], "device": res.get("device", "cpu"),
                   "train_samples": res.get("train_samples")}
            fl.epochs.append(rec)
            fl.trial.report(rec["val_acc"], rec["epoch"])
        fl.trial.set_user_attr("epochs", fl.epochs)
        if res["epochs_done"] >= fl.params["epochs"]:
            value = fl.epochs[-1]["val_acc"]
            if value > self.best_value:
                self.best_value = value
                save_best(self.best_path, fl.trial.number, fl.params, value, res["state"])
            self._finish(fl, TrialState.COMPLETE, value)
        elif fl.trial.should_prune():
            self._finish(fl, TrialState.PRUNED)
        else:
            self._submit_chunk(fl, res["state"])

    def _finish(self, fl: _Flight, state: TrialState, value: float | None = None, why: str | None = None):
        if why:
            fl.trial.set_user_attr("fail_reason", why)
        self.study.tell(fl.trial, value if state == TrialState.COMPLETE else None, state=state)
        self.finished += 1
        shown = f" val_acc={value:.4f}" if value is not None else (f" ({why})" if why else "")
        _log(f"{self.plan.name}: trial {fl.trial.number} {state.name}{shown} after {len(fl.epochs)} epochs "
             f"[{self.finished}/{self.plan.n_trials}]")
