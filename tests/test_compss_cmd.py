"""Exact command lines for local, runcompss and enqueue_compss runs of a task app (no COMPSs needed)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hpcdl.platform.kit.config import ConfigError
from hpcdl.platform.kit.procenv import child_env
from hpcdl.platform.orchestration.task_runtime import compss

REPO = Path(__file__).resolve().parents[1]


def cfg_for(tmp_path, runtime="compss", **compss_block):
    """A checkpoint block on the CPU (its tasks can hold GPUs: the GPU commands are tested below)."""
    cfg = {"results_dir": str(tmp_path / "results"), "studies": ["checkpoint"],
           "checkpoint": {"runtime": runtime, "computing_units": "2", "dcp_ranks": [1, 2], "device": "cpu"}}
    if compss_block:
        cfg["compss"] = compss_block
    return cfg


def test_local_runtime_is_plain_python_module(tmp_path):
    cmd = compss.task_app_command("checkpoint", "results/checkpoint/config.json", cfg_for(tmp_path, "local"))
    assert cmd == "python -m tasks.checkpoint --config results/checkpoint/config.json"


def test_runtime_defaults_to_local(tmp_path):
    cfg = {"results_dir": "results", "hpo": {}}
    assert compss.task_app_command("hpo", "c.json", cfg) == "python -m tasks.hpo --config c.json"


def test_runcompss_command_exact(tmp_path):
    cfg = cfg_for(tmp_path)
    rdir = tmp_path / "results" / "checkpoint" / "compss" / "checkpoint_run"
    argv = compss.runcompss_command("checkpoint", "/abs/config.json", cfg)
    assert argv == [
        "runcompss", "--lang=python",
        f"--project={rdir}/project.xml", f"--resources={rdir}/resources.xml",
        f"--specific_log_dir={rdir}/log",
        f"--pythonpath={REPO}",
        "--python_interpreter=python3", "--log_level=off", "--summary",
        f"{REPO}/tasks/checkpoint.py", "--config", "/abs/config.json",
    ]


def test_compss_task_app_writes_xml_then_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = compss.task_app_command("checkpoint", "results/checkpoint/config.json", cfg_for(tmp_path))
    rdir = tmp_path / "results" / "checkpoint" / "compss" / "checkpoint_run"
    xml_part, run_part = cmd.removeprefix("(").removesuffix(")").split(" && ")
    assert xml_part == (f"python -m hpcdl compss xml --out {rdir} --working-dir {rdir}/worker "
                        '--cpus "${SLURM_CPUS_PER_TASK:-$(nproc)}"')
    run = shlex.split(run_part)
    # set where COMPSs reads them
    assert run[:3] == ["HPCDL_CHECKPOINT_UNITS=2", "HPCDL_CHECKPOINT_GPUS=0", "runcompss"]
    # the config path handed to COMPSs is absolute (its master may not start in our cwd)
    assert run[-2:] == ["--config", str(tmp_path / "results/checkpoint/config.json")]
    assert f"{REPO}/tasks/checkpoint.py" in run


def test_fixed_computing_units_and_extra_flags(tmp_path):
    cfg = cfg_for(tmp_path, computing_units=8, extra_flags=["--tracing"], python_interpreter="python3.11",
                  log_level="info")
    cmd = compss.task_app_command("checkpoint", "/c.json", cfg)
    assert "--cpus 8 " in cmd
    run = shlex.split(cmd.split(" && ")[1].rstrip(")"))
    assert "--tracing" in run and run.index("--tracing") < run.index(f"{REPO}/tasks/checkpoint.py")
    assert "--python_interpreter=python3.11" in run and "--log_level=info" in run


def test_site_xml_skips_generation(tmp_path):
    cfg = cfg_for(tmp_path, project_xml="/site/project.xml", resources_xml="/site/resources.xml")
    cmd = compss.task_app_command("checkpoint", "/c.json", cfg)
    assert "hpcdl compss xml" not in cmd
    argv = shlex.split(cmd)
    assert "--project=/site/project.xml" in argv and "--resources=/site/resources.xml" in argv


def test_two_rules_never_share_a_log_or_working_dir(tmp_path):
    cfg = {**cfg_for(tmp_path), "hpo": {"runtime": "compss", "computing_units": "1"}}
    dirs = set()
    for study, rule in (("checkpoint", None), ("hpo", None), ("checkpoint", "checkpoint_other")):
        argv = compss.runcompss_command(study, "/c.json", cfg, rule=rule)
        log = next(a for a in argv if a.startswith("--specific_log_dir="))
        dirs.add(log)
    assert len(dirs) == 3


def test_enqueue_compss_command_exact(tmp_path):
    cfg = cfg_for(tmp_path, num_nodes=2, exec_time_min=30, cpus_per_node=16, queue="gp", qos="debug",
                  project_name="bsc99")
    rdir = tmp_path / "results" / "checkpoint" / "compss" / "checkpoint_run"
    argv = compss.enqueue_compss_command("checkpoint", "/abs/c.json", cfg)
    assert argv == [
        "env", "HPCDL_CHECKPOINT_UNITS=2", "HPCDL_CHECKPOINT_GPUS=0",
        "enqueue_compss", "--lang=python", "--num_nodes=2", "--exec_time=30", "--cpus_per_node=16",
        "--worker_in_master_cpus=16", "--job_name=hpcdl_checkpoint",
        f"--master_working_dir={rdir}/master", f"--worker_working_dir={rdir}/worker",
        f"--base_log_dir={rdir}/log", f"--pythonpath={REPO}", "--python_interpreter=python3",
        "--log_level=off", "--summary", "--queue=gp", "--qos=debug", "--project_name=bsc99",
        f"{REPO}/tasks/checkpoint.py", "--config", "/abs/c.json",
    ]


@pytest.mark.parametrize("block, key", [
    ({"runtime": "mpi"}, "checkpoint.runtime"),
])
def test_bad_runtime_names_the_key(tmp_path, block, key):
    cfg = {"results_dir": "r", "checkpoint": block}
    with pytest.raises(ConfigError, match=rf"'{key}'.*allowed: local, compss"):
        compss.task_app_command("checkpoint", "c.json", cfg)


@pytest.mark.parametrize("block, key", [
    ({"computing_units": 0}, "compss.computing_units"),
    ({"project_xml": "/p.xml"}, "compss.resources_xml"),
    ({"resources_xml": "/r.xml"}, "compss.project_xml"),
    ({"cores": 4}, "compss.cores"),
])
def test_bad_compss_block_names_the_key(tmp_path, block, key):
    with pytest.raises(ConfigError, match=rf"'{key}'"):
        compss.task_app_command("checkpoint", "c.json", cfg_for(tmp_path, **block))


def test_xml_subcommand_writes_parseable_files(tmp_path):
    out = tmp_path / "rule"
    subprocess.run([sys.executable, "-m", "hpcdl", "compss", "xml", "--out", str(out), "--cpus", "3",
                    "--working-dir", str(out / "worker")], check=True, cwd=REPO, capture_output=True)
    res = ET.parse(out / "resources.xml").getroot()
    assert res.find("./ComputeNode/Processor/ComputingUnits").text == "3"
    proj = ET.parse(out / "project.xml").getroot()
    assert proj.find("./ComputeNode/WorkingDir").text == str(out / "worker")
    assert (out / "log").is_dir() and (out / "worker").is_dir()


def test_xml_rejects_zero_cpus(tmp_path):
    with pytest.raises(ValueError, match="--cpus must be >= 1"):
        compss.write_xml(tmp_path, 0, tmp_path / "w")


def test_runtime_cpus_expand_in_a_shell(tmp_path):
    # What the rule's shell sees: Slurm's grant when set, else nproc.
    snippet = f'echo "{compss.RUNTIME_CPUS}"'
    env_slurm = {"PATH": "/usr/bin:/bin", "SLURM_CPUS_PER_TASK": "6"}
    assert subprocess.run(["bash", "-c", snippet], env=env_slurm, capture_output=True,
                          text=True).stdout.strip() == "6"
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    assert subprocess.run(["bash", "-c", snippet], env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True).stdout.strip() == nproc


def _compss_cli(tmp_path, subcommand: str, checkpoint_block: str):
    """`hpcdl compss <subcommand> checkpoint --config c.yaml` run in tmp_path on a checkpoint-only config
    written there: (the config's path, what the command printed)."""
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(f"results_dir: {tmp_path / 'results'}\nstudies: [checkpoint]\n"
                        f"checkpoint: {checkpoint_block}\n")
    out = subprocess.run([sys.executable, "-m", "hpcdl", "compss", subcommand, "checkpoint",
                          "--config", "c.yaml"], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env=child_env(REPO))
    return cfg_file, out.stdout


def test_enqueue_cli_prints_the_command_with_an_absolute_config(tmp_path):
    cfg_file, printed = _compss_cli(tmp_path, "enqueue", "{device: cpu}")
    argv = shlex.split(printed)
    # "2": the schema's default
    assert argv[:4] == ["env", "HPCDL_CHECKPOINT_UNITS=2", "HPCDL_CHECKPOINT_GPUS=0", "enqueue_compss"]
    assert argv[-2:] == ["--config", str(cfg_file)]


def test_schema_fills_compss_defaults_and_names_bad_keys(test_config):
    from hpcdl.platform.kit.config import validate_config

    cfg = validate_config({**test_config, "compss": {"queue": "gp"}})
    assert cfg["compss"]["python_interpreter"] == "python3" and cfg["compss"]["computing_units"] is None
    assert compss.compss_options(cfg)["queue"] == "gp"
    with pytest.raises(ConfigError, match="'compss.computing_units'"):
        validate_config({**test_config, "compss": {"computing_units": 0}})
    with pytest.raises(ConfigError, match="compss"):
        validate_config({**test_config, "compss": {"cores": 4}})


def _compss_cfg(test_config, tmp_path):
    from hpcdl.platform.kit.config import validate_config

    cfg = {**test_config, "results_dir": str(tmp_path / "results")}
    for study in cfg["studies"]:
        cfg[study] = {**cfg[study], "runtime": "compss"}
    return validate_config(cfg)


# studies whose tasks hold GPUs on CUDA (StudySpec.task_gpus > 0): their commands set HPCDL_<STUDY>_GPUS
GPU_STUDIES = ("checkpoint", "hetmem", "hpo", "microbatch", "offload", "shuffle", "spatial")


def test_every_rule_command_sets_its_task_units_where_compss_reads_them(test_config, tmp_path):
    """test.yaml: checkpoint and hpo say "1"; shuffle's largest M is 2; spatial's largest run 2 ranks x 1.
    GPU_STUDIES' tasks can hold GPUs: their commands set the GPUs too (device auto: 0 for
    enqueue_compss without --gpus_per_node; the rule's shell asks where it runs)."""
    cfg = _compss_cfg(test_config, tmp_path)
    expected = {"checkpoint": "1", "hpo": "1", "shuffle": "2", "spatial": "2"}
    for study, units in expected.items():
        cmd = compss.task_app_command(study, "c.json", cfg)
        run = shlex.split(cmd.removeprefix("(").removesuffix(")").split(" && ")[1])
        var = f"HPCDL_{study.upper()}"
        gpus = [f"{var}_GPUS=$(python -m hpcdl compss gpus {study} --config {os.path.abspath('c.json')})"]
        gpus = gpus if study in GPU_STUDIES else []
        assert run[:len(gpus) + 2] == [f"{var}_UNITS={units}", *gpus, "runcompss"], (study, run[:3])
        enq = compss.enqueue_compss_command(study, "/c.json", cfg)
        gpus = [f"{var}_GPUS=0"] if study in GPU_STUDIES else []
        assert enq[:len(gpus) + 3] == ["env", f"{var}_UNITS={units}", *gpus, "enqueue_compss"]


def test_a_var_setting_is_expanded_by_the_shell_that_runs_the_rule(test_config, tmp_path):
    """The generated command runs in a real shell; a stand-in runcompss on PATH reports its environment."""
    cfg = _compss_cfg(test_config, tmp_path)
    cfg["checkpoint"]["computing_units"] = "$SLURM_CPUS_PER_TASK"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool, body in (("runcompss", 'echo "units=$HPCDL_CHECKPOINT_UNITS"'), ("python", "exit 0")):
        (bindir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / tool).chmod(0o755)
    cmd = compss.task_app_command("checkpoint", "c.json", cfg)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "SLURM_CPUS_PER_TASK": "6"}
    out = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "units=6"


def test_enqueue_resolves_a_var_setting_now_or_names_it(test_config, tmp_path, monkeypatch):
    from hpcdl.platform.orchestration.task_runtime.units import UnitsError

    cfg = _compss_cfg(test_config, tmp_path)
    cfg["hpo"]["computing_units"] = "$HPCDL_TEST_CORES"
    monkeypatch.delenv("HPCDL_TEST_CORES", raising=False)
    with pytest.raises(UnitsError, match=r"hpo.computing_units='\$HPCDL_TEST_CORES'.*HPCDL_TEST_CORES, "
                                         r"which is not set"):
        compss.enqueue_compss_command("hpo", "/c.json", cfg)
    monkeypatch.setenv("HPCDL_TEST_CORES", "12")
    assert compss.enqueue_compss_command("hpo", "/c.json", cfg)[1] == "HPCDL_HPO_UNITS=12"


def test_command_cli_prints_the_rule_command(tmp_path):
    block = "{runtime: compss, computing_units: '3', device: cpu}"
    cfg_file, printed = _compss_cli(tmp_path, "command", block)
    assert "HPCDL_CHECKPOINT_UNITS=3 HPCDL_CHECKPOINT_GPUS=0 runcompss --lang=python" in printed
    assert printed.rstrip().endswith(f"--config {cfg_file})")


# -- GPUs: HPCDL_<STUDY>_GPUS (hpcdl.platform.orchestration.task_runtime.gpus) -------------------------

def _gpu_cfg(test_config, tmp_path, device, **compss_block):
    from hpcdl.platform.kit.config import validate_config

    cfg = {**test_config, "results_dir": str(tmp_path / "results"),
           "spatial": {**test_config["spatial"], "runtime": "compss", "device": device}}
    if compss_block:
        cfg["compss"] = compss_block
    return validate_config(cfg)


def _run_words(cmd: str) -> list[str]:
    return shlex.split(cmd.removeprefix("(").removesuffix(")").split(" && ")[-1])


@pytest.mark.parametrize("device, word", [("cuda", "2"), ("cpu", "0")])
def test_cuda_and_cpu_set_the_gpus_wherever_the_command_is_made(test_config, tmp_path, device, word):
    """test.yaml: spatial's largest run has 2 ranks, one GPU each."""
    cfg = _gpu_cfg(test_config, tmp_path, device)
    run = _run_words(compss.task_app_command("spatial", "c.json", cfg))
    assert run[:3] == ["HPCDL_SPATIAL_UNITS=2", f"HPCDL_SPATIAL_GPUS={word}", "runcompss"]
    assert ("--gpus visible" in compss.xml_command("spatial", cfg)) == (device == "cuda")


def test_auto_is_resolved_by_the_shell_that_runs_the_rule(test_config, tmp_path):
    """The generated command runs in a real shell with this repository's Python: what reaches the
    runtime is what `device: auto` resolves to on the host running the rule (here: no GPU, 0)."""
    import yaml

    cfg = _gpu_cfg(test_config, tmp_path, "auto", project_xml="/site/p.xml", resources_xml="/site/r.xml")
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    cmd = compss.task_app_command("spatial", str(cfg_file), cfg)
    assert f'HPCDL_SPATIAL_GPUS="$(python -m hpcdl compss gpus spatial --config {cfg_file})"' in cmd
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "runcompss").write_text('#!/bin/sh\necho "gpus=$HPCDL_SPATIAL_GPUS"\n')
    (bindir / "runcompss").chmod(0o755)
    # the rule's environment: this interpreter's bin directory on PATH, a stand-in runcompss first
    path = f"{bindir}:{Path(sys.executable).parent}:/usr/bin:/bin"
    env = child_env(REPO, PATH=path)
    out = subprocess.run(["bash", "-c", cmd], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    from hpcdl.platform.orchestration.task_runtime.gpus import task_gpus

    assert out.stdout.strip() == f"gpus={task_gpus('spatial', cfg)}"


def test_gpus_cli_prints_the_gpus_per_task_here_or_names_the_key(test_config, tmp_path):
    import torch
    import yaml

    outs = {}
    for device in ("cpu", "auto", "cuda"):
        cfg_file = tmp_path / f"{device}.yaml"
        cfg_file.write_text(yaml.safe_dump(_gpu_cfg(test_config, tmp_path, "cpu") | {
            "spatial": {**test_config["spatial"], "device": device}}))
        outs[device] = subprocess.run([sys.executable, "-m", "hpcdl", "compss", "gpus", "spatial", "--config",
                                       str(cfg_file)], cwd=REPO, capture_output=True, text=True)
    gpu = torch.cuda.is_available()
    assert outs["cpu"].stdout.strip() == "0"
    assert outs["auto"].stdout.strip() == ("2" if gpu else "0")
    if not gpu:
        assert outs["cuda"].returncode == 2 and "'spatial.device': 'cuda'" in outs["cuda"].stderr


def test_enqueue_asks_for_the_gpus_of_cuda_and_auto_follows_the_job(test_config, tmp_path):
    enq = compss.enqueue_compss_command("spatial", "/c.json", _gpu_cfg(test_config, tmp_path, "cuda"))
    assert enq[:4] == ["env", "HPCDL_SPATIAL_UNITS=2", "HPCDL_SPATIAL_GPUS=2", "enqueue_compss"]
    assert "--gpus_per_node=2" in enq
    # auto: GPUs exactly when the job asks for them
    asked = _gpu_cfg(test_config, tmp_path, "auto", extra_flags=["--gpus_per_node=4"])
    enq = compss.enqueue_compss_command("spatial", "/c.json", asked)
    assert "HPCDL_SPATIAL_GPUS=2" in enq and enq.count("--gpus_per_node=4") == 1
    enq = compss.enqueue_compss_command("spatial", "/c.json", _gpu_cfg(test_config, tmp_path, "auto"))
    assert "HPCDL_SPATIAL_GPUS=0" in enq and not any(a.startswith("--gpus_per_node") for a in enq)
    too_few = _gpu_cfg(test_config, tmp_path, "cuda", extra_flags=["--gpus_per_node=1"])
    with pytest.raises(ConfigError, match=r"'compss.extra_flags': '--gpus_per_node=1'.*each spatial task "
                                          r"holds 2 GPU"):
        compss.enqueue_compss_command("spatial", "/c.json", too_few)


def test_xml_offers_the_gpus_it_is_given(tmp_path):
    out = tmp_path / "rule"
    subprocess.run([sys.executable, "-m", "hpcdl", "compss", "xml", "--out", str(out), "--cpus", "4",
                    "--gpus", "2", "--working-dir", str(out / "worker")], check=True, cwd=REPO,
                   capture_output=True)
    procs = ET.parse(out / "resources.xml").getroot().findall("./ComputeNode/Processor")
    assert [(p.get("Name"), p.findtext("Type"), p.findtext("ComputingUnits")) for p in procs] == [
        ("MainProcessor", None, "4"), ("GPU", "GPU", "2")]
    subprocess.run([sys.executable, "-m", "hpcdl", "compss", "xml", "--out", str(out), "--cpus", "4",
                    "--gpus", "visible", "--working-dir", str(out / "worker")], check=True, cwd=REPO,
                   capture_output=True)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    procs = ET.parse(out / "resources.xml").getroot().findall("./ComputeNode/Processor")
    assert [p.findtext("ComputingUnits") for p in procs] == ["4", *([str(gpus)] if gpus else [])]
