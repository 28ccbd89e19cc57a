"""GPU records (hpcdl.platform.orchestration.gpu_records): a `make gpu` run's records imported, read back and
shown by the report beside this run, never in its verdict (docs/architecture.md, "Report").

Every record here is HAND-MADE in tmp_path, in the layout envs/gpu_run.py leaves (device.json, one
folder per study with claims.json and its tables' CSVs and sidecars copied flat, calibration/,
engines/, logs): no GPU measured these numbers, and none of them is ever written under resources/.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from hpcdl.platform.kit.claims import claim, not_measured, write_claims
from hpcdl.platform.kit.device import gpu_slug
from hpcdl.platform.kit.study import StudySpec
from hpcdl.platform.orchestration import about, cli, gpu_records, record_state
from hpcdl.platform.orchestration.gpu_records import RecordError, import_records, read_records, record_inputs
from hpcdl.platform.orchestration.verdict import main as verdict_main
from hpcdl.platform.orchestration.verdict import render_html, verdict

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "envs"))
import gpu_files  # noqa: E402  (envs/ is not a package: the archive is made as `make gpu` makes it)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
# What hpcdl.platform.kit.device.cuda_record() plus gpu_run's additions say on an H200 (hand-made).
DEVICE = {"gpu_model": "NVIDIA H200", "gpu_count": 1, "gpu_capability": "9.0",
          "gpu_memory_bytes": 150_000_000_000, "driver": "580.65.06", "cuda": "13.0", "cudnn": "91900",
          "nccl": "2.27.7", "python": "/opt/venv/bin/python3", "torch": "2.11.0+cu130", "pandas": "2.3.3"}


def _sidecar(path: Path, start: str, end: str, commit: str = COMMIT, gpu: str | None = "NVIDIA H200") -> None:
    rec = {"git_commit": commit, "config_hash": "c0ffee" * 10, "host": "gpu-node", "cores": 16,
           "cpu_model": "AMD EPYC 9654", "start_time": start, "end_time": end}
    rec |= {"device": "cuda", "gpu_model": gpu} if gpu else {"device": "cpu"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))


def _study(results: Path, records: Path, study: str, claims: list[dict], start: str, end: str,
           **side) -> None:
    """A study as the GPU run's workflow leaves it (tables + sidecars, claims.json), copied flat into
    the records as gpu_run.Runner.studies copies it."""
    tables = results / study / "tables"
    tables.mkdir(parents=True)
    pd.DataFrame({"size_bytes": [1024, 2048], "time_s": [0.5, 0.9]}).to_csv(tables / "runs.csv", index=False)
    _sidecar(tables / "runs.provenance.json", start, end, **side)
    write_claims(results / study, study, claims)
    for f in [results / study / "claims.json", *tables.glob("*")]:
        (records / study).mkdir(exist_ok=True)
        shutil.copyfile(f, records / study / f.name)


def hand_made_run(tmp_path: Path, name: str = "gpu-records", studies=("hetmem", "microbatch"),
                  device: dict = DEVICE) -> Path:
    """A hand-made GPU run's records folder: hetmem 2/3 held (one not measured), microbatch 1/1,
    offload with tables but no claims.json (its claims stage did not finish)."""
    records, results = tmp_path / name, tmp_path / f"{name}-results"
    records.mkdir()
    (records / "device.json").write_text(json.dumps(device, indent=1))
    (records / "summary.json").write_text(json.dumps([{"step": "setup", "exit": 0, "seconds": 40.1}]))
    (records / "workflow.log").write_text("$ snakemake ...\n")
    (records / "calibration").mkdir()
    (records / "calibration" / "nvidia-h200.csv").write_text("id,median_s\nconv1,0.001\n")
    (records / "engines").mkdir()
    if "hetmem" in studies:
        _study(results, records, "hetmem", [
            claim("tier_order", "GPU memory beats the host tier by 10x", True, ratio=14.2, threshold=10.0),
            claim("prefetch_hides", "prefetch hides the host tier's latency", True, hidden=0.93),
            not_measured("nvme_tier", "the NVMe tier stays within 3x of host", "point nvme-4 failed: ENOSPC"),
        ], "2026-05-02T10:00:00+00:00", "2026-05-02T10:01:30+00:00")
    if "microbatch" in studies:
        _study(results, records, "microbatch", [
            claim("workspace_limit", "a 64 MiB workspace limit costs under 5 %", True, slowdown=0.031),
        ], "2026-05-02T10:02:00+00:00", "2026-05-02T10:03:10+00:00")
    # What gpu_run writes before each study starts: hetmem ran today's code; microbatch ran a tree whose
    # compute.py and gpu.yaml block differ from today's (hand-made older code)
    for study in studies:
        fp = record_state.tree_fingerprint(REPO, study)
        if study == "microbatch":
            fp["files"]["hpcdl/studies/microbatch/compute.py"] = "0" * 40
            fp["config"] = "older"
        (records / study / "fingerprint.json").write_text(json.dumps(fp))
    (records / "offload").mkdir()
    (records / "offload" / "runs.csv").write_text("a\n1\n")
    return records


def test_gpu_slug_is_the_models_short_name():
    assert gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert gpu_slug("NVIDIA GeForce RTX 4090") == "rtx4090"
    with pytest.raises(ValueError, match="no short name in the GPU model 'NVIDIA'"):
        gpu_slug("NVIDIA")


def test_import_from_a_folder_writes_the_record_and_the_study_folders(tmp_path):
    run = hand_made_run(tmp_path)
    root = tmp_path / "resources" / "gpu-records"
    folder = import_records(run, root)
    assert folder == root / "h200"
    rec = json.loads((folder / "record.json").read_text())
    assert rec["gpu"] == "NVIDIA H200" and rec["slug"] == "h200" and rec["device"] == DEVICE
    assert rec["started"] == "2026-05-02T10:00:00+00:00" and rec["ended"] == "2026-05-02T10:03:10+00:00"
    assert rec["commits"] == [COMMIT]
    hetmem = rec["studies"]["hetmem"]
    assert (hetmem["commit"], hetmem["started"], hetmem["ended"]) == \
        (COMMIT, "2026-05-02T10:00:00+00:00", "2026-05-02T10:01:30+00:00")
    assert hetmem["measured_on"] == "GPU: NVIDIA H200" and hetmem["source"] == run.name
    assert rec["imports"][0]["studies"] == ["hetmem", "microbatch"]
    assert rec["imports"][0]["not_imported"] == {
        "offload": "no claims.json (its claims stage did not finish on the GPU)"}
    # The study folders as the run wrote them; what is no study's is not copied.
    assert sorted(p.name for p in folder.iterdir()) == ["hetmem", "microbatch", "record.json"]
    assert sorted(p.name for p in (folder / "hetmem").iterdir()) == \
        ["claims.json", "runs.csv", "runs.provenance.json"]
    assert (folder / "hetmem" / "claims.json").read_bytes() == (run / "hetmem" / "claims.json").read_bytes()
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temp folder left


def test_import_from_the_archive_make_gpu_leaves(tmp_path):
    archive = gpu_files.archive_records(hand_made_run(tmp_path))
    assert archive.name == "gpu-records.tgz"
    root = tmp_path / "committed"
    folder = import_records(archive, root)
    rec = json.loads((folder / "record.json").read_text())
    assert rec["imports"][0]["source"]["name"] == archive.name  # by name: a path is the importing machine's
    assert re.fullmatch(r"[0-9a-f]{64}", rec["imports"][0]["source"]["sha256"])
    doc = json.loads((folder / "microbatch" / "claims.json").read_text())
    assert doc["claims"][0]["id"] == "workspace_limit"


def test_read_back_per_gpu_and_study(tmp_path):
    root = tmp_path / "records"
    import_records(hand_made_run(tmp_path), root)
    (got,) = read_records(root)
    assert (got["gpu"], got["slug"], got["date"], got["commit"]) == \
        ("NVIDIA H200", "h200", "2026-05-02", COMMIT)
    assert got["device"]["cuda"] == "13.0"
    hetmem = got["studies"]["hetmem"]
    assert (hetmem["passed"], hetmem["total"], hetmem["date"]) == (2, 3, "2026-05-02")
    assert [c["id"] for c in hetmem["claims"]] == ["tier_order", "prefetch_hides", "nvme_tier"]
    assert read_records(tmp_path / "none") == []
    assert record_inputs(str(root), ["hetmem", "offload"]) == [
        f"{root}/h200/record.json", f"{root}/h200/hetmem/claims.json"]
    assert record_inputs(str(tmp_path / "none"), ["hetmem"]) == [] and record_inputs(None, ["hetmem"]) == []


def test_a_second_call_adds_its_studies_and_keeps_the_others(tmp_path):
    root = tmp_path / "records"
    import_records(hand_made_run(tmp_path, studies=("hetmem", "microbatch")), root)
    # make gpu-studies on a fresh machine: only microbatch, on a newer commit
    later = hand_made_run(tmp_path, "second", studies=("microbatch",))
    newer = "fedcba9876543210fedcba9876543210fedcba98"
    side = later / "microbatch" / "runs.provenance.json"
    side.write_text(json.dumps({**json.loads(side.read_text()), "git_commit": newer,
                                "start_time": "2026-05-03T08:00:00+00:00",
                                "end_time": "2026-05-03T08:01:00+00:00"}))
    import_records(later, root)
    (got,) = read_records(root)
    assert sorted(got["studies"]) == ["hetmem", "microbatch"]
    assert got["studies"]["hetmem"]["commit"] == COMMIT and got["studies"]["microbatch"]["commit"] == newer
    assert got["commits"] == sorted([COMMIT, newer]) and got["ended"] == "2026-05-03T08:01:00+00:00"
    assert [i["studies"] for i in got["imports"]] == [["hetmem", "microbatch"], ["microbatch"]]


def test_an_import_keeps_the_readme_and_logs_committed_beside_the_studies(tmp_path):
    root = tmp_path / "records"
    folder = import_records(hand_made_run(tmp_path, studies=("hetmem", "microbatch")), root)
    (folder / "README.md").write_text("# one H200, two calls\n")
    (folder / "logs" / "2026-05-02").mkdir(parents=True)
    (folder / "logs" / "2026-05-02" / "workflow.log").write_text("$ snakemake ...\n")
    import_records(hand_made_run(tmp_path, "second", studies=("microbatch",)), root)
    assert (folder / "README.md").read_text() == "# one H200, two calls\n"
    assert (folder / "logs" / "2026-05-02" / "workflow.log").read_text() == "$ snakemake ...\n"
    assert sorted(read_records(root)[0]["studies"]) == ["hetmem", "microbatch"]


def test_a_failed_import_leaves_the_committed_record_as_it_was(tmp_path):
    root = tmp_path / "records"
    import_records(hand_made_run(tmp_path), root)
    before = {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    # A model whose short name is taken by another GPU's record is refused, naming that record.
    other = hand_made_run(tmp_path, "nvl", device={**DEVICE, "gpu_model": "NVIDIA H200 NVL"})
    with pytest.raises(RecordError, match=r"h200/record\.json: records 'NVIDIA H200', not 'NVIDIA H200 NVL'"):
        import_records(other, root)
    # A copy that fails half-way (a folder where a table should be) leaves no trace.
    broken = hand_made_run(tmp_path, "broken")
    (broken / "hetmem" / "zz.csv").mkdir()
    with pytest.raises(IsADirectoryError):
        import_records(broken, root)
    after = {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert after == before and not [p for p in root.iterdir() if p.name.startswith(".")]


def _drop(run: Path, rel: str) -> None:
    (run / rel).unlink()


def _write(rel: str, text: str):
    return lambda run: (run / rel).write_text(text)


def _edit_json(rel: str, change):
    def edit(run: Path) -> None:
        doc = json.loads((run / rel).read_text())
        change(doc)
        (run / rel).write_text(json.dumps(doc))
    return edit


BAD_LAYOUTS = {
    "no device record": (lambda run: _drop(run, "device.json"), r"gpu-records/device\.json: missing"),
    "device record unparsable": (_write("device.json", "{not json"),
                                 r"gpu-records/device\.json: the device record does not parse"),
    "a smoke run's device record": (_write("device.json", json.dumps({"device": "cpu", "torch": "2.13.0"})),
                                    r"gpu-records/device\.json: no 'gpu_model'"),
    "claims unparsable": (_write("hetmem/claims.json", '{"claims": ['),
                          r"gpu-records/hetmem/claims\.json: the claims of study hetmem does not parse"),
    "claims without a list": (_write("hetmem/claims.json", '{"study": "hetmem"}'),
                              r"gpu-records/hetmem/claims\.json: no 'claims' list"),
    "another study's claims": (_edit_json("hetmem/claims.json", lambda d: d.update(study="offload")),
                               r"hetmem/claims\.json: claims of study 'offload' in the folder of "
                               r"study 'hetmem'"),
    "a claim without a status": (_edit_json("microbatch/claims.json", lambda d: d["claims"][0].pop("status")),
                                 r"microbatch/claims\.json: claims\[0\] needs an 'id' and a 'status'"),
    "a sidecar without a commit": (_edit_json("hetmem/runs.provenance.json", lambda d: d.pop("git_commit")),
                                   r"hetmem/runs\.provenance\.json: no git_commit"),
    "no sidecar": (lambda run: _drop(run, "microbatch/runs.provenance.json"),
                   r"microbatch/\*\.provenance\.json: none"),
    "no study": (lambda run: [shutil.rmtree(run / s) for s in ("hetmem", "microbatch")],
                 r"<study>/claims\.json: none in any study folder"),
}


@pytest.mark.parametrize("case", list(BAD_LAYOUTS))
def test_a_wrong_layout_is_refused_naming_the_file(tmp_path, case):
    spoil, message = BAD_LAYOUTS[case]
    run = hand_made_run(tmp_path)
    spoil(run)
    root = tmp_path / "records"
    with pytest.raises(RecordError, match=message):
        import_records(run, root)
    assert not root.exists() or not list(root.iterdir())  # nothing written


def test_a_bad_committed_record_is_an_error_naming_it(tmp_path):
    root = tmp_path / "records"
    import_records(hand_made_run(tmp_path), root)
    (root / "h200" / "record.json").write_text('{"gpu": "NVIDIA H200"}')
    with pytest.raises(RecordError, match=r"h200/record\.json: needs 'gpu' and a 'studies' object"):
        read_records(root)
    with pytest.raises(RecordError, match=r"no\.tgz: no such archive or folder"):
        import_records(tmp_path / "no.tgz", root)
    (tmp_path / "junk.tgz").write_bytes(b"not gzip at all")
    with pytest.raises(RecordError, match=r"junk\.tgz: not a readable \.tgz archive"):
        import_records(tmp_path / "junk.tgz", root)


def test_the_cli_imports_and_lists(tmp_path, capsys):
    root = tmp_path / "records"
    archive = gpu_files.archive_records(hand_made_run(tmp_path))
    assert cli.main(["gpu-records", "import", str(archive), "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"{root / 'h200'}: NVIDIA H200, studies hetmem, microbatch imported" in out
    assert "not imported: offload: no claims.json" in out
    assert cli.main(["gpu-records", "list", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"h200: NVIDIA H200 (2026-05-02, commit {COMMIT})" in out
    assert re.search(r"hetmem\s+2/3 claims held  \(2026-05-02, commit 0123456789ab, GPU: NVIDIA H200\)", out)
    assert cli.main(["gpu-records", "import", str(tmp_path / "missing"), "--root", str(root)]) == 2
    assert "error: " in capsys.readouterr().err
    assert cli.main(["gpu-records", "list", "--root", str(tmp_path / "empty")]) == 0
    assert "no GPU records under" in capsys.readouterr().out


def _this_run(tmp_path: Path) -> Path:
    """This (CPU) run's results: hetmem 1/2 held, microbatch not run."""
    res = tmp_path / "results"
    write_claims(res / "hetmem", "hetmem", [
        claim("tier_order", "GPU memory beats the host tier by 10x", False, ratio=1.1, threshold=10.0),
        claim("prefetch_hides", "prefetch hides the host tier's latency", True, hidden=0.9)])
    return res


def test_the_verdict_shows_the_record_beside_this_run_and_counts_only_this_run(tmp_path):
    res = _this_run(tmp_path)
    root = tmp_path / "records"
    import_records(hand_made_run(tmp_path), root)
    without = verdict(res, ["hetmem", "microbatch"])
    with_records = verdict(res, ["hetmem", "microbatch"], root)
    assert [e["gpu_records"] for e in without] == [[], []]
    for a, b in zip(without, with_records, strict=True):  # everything of this run's verdict unchanged
        assert {k: v for k, v in b.items() if k != "gpu_records"} == \
            {k: v for k, v in a.items() if k != "gpu_records"}
    assert [r["slug"] for r in with_records[0]["gpu_records"]] == ["h200"]
    page = render_html(with_records)
    assert "Verdict: 1/2 claims hold on this run (1 of 2 studies ran)" in page  # the record's 3/4 apart
    hetmem = re.search(r"<tbody class='study' data-study='hetmem'.*?</tbody>", page, re.S).group(0)
    assert "data-passed='1' data-total='2'" in hetmem  # this run's counts
    line = re.search(r"<div class='gpu-record' data-gpu='h200' data-passed='2' data-total='3'.*?</div>",
                     hetmem, re.S).group(0)
    assert f"recorded on NVIDIA H200 (2026-05-02, commit {COMMIT[:12]}); current: " in line
    assert ">2/3</b>" in line
    # the landing page counts the studies whose record measured today's code, and names the others
    count = re.search(r"<p id='gpu-records-count' data-current='1' data-studies='2'.*?</p>", page).group(0)
    assert "<b>1 of 2</b> studies recorded on a GPU at today's code (on older code: microbatch)" in count
    # microbatch did not run here; its GPU record is still shown, apart from "not run".
    micro = re.search(r"<tbody class='study' data-study='microbatch'.*?</tbody>", page, re.S).group(0)
    assert "data-state='not run'" in micro and "data-gpu='h200' data-passed='1' data-total='1'" in micro
    assert "gpu-record" not in render_html(without)
    # The verdict's command line takes the records' folder (the workflow's rule passes the config's).
    out = tmp_path / "verdict.html"
    argv = ["--results-dir", str(res), "--out", str(out), "--gpu-records", str(root), "hetmem"]
    assert verdict_main(argv) == 0
    assert "data-gpu='h200' data-passed='2' data-total='3'" in out.read_text()


TOY_HETMEM = StudySpec(name="hetmem", title="Heterogeneous memory (hand-made spec)", raw_tables=("runs",),
                       tables=("runs",), figures=("bandwidth",), task_units=lambda cfg: 1,
                       run_resources=lambda cfg: {}, question="Does a host tier keep up?",
                       headline="bandwidth", setting=lambda cfg: "2 tiers")


def test_the_about_page_shows_the_recorded_claims_under_their_label(tmp_path):
    resources = tmp_path / "resources"
    import_records(hand_made_run(tmp_path), resources / "gpu-records")
    res = _this_run(tmp_path)
    cfg = {"results_dir": str(res), "data": {"resources_dir": str(resources)}, "hetmem": {}}
    # the records come from the config's resources_dir, as the about rule's command finds them
    page = about.write(TOY_HETMEM, cfg, res / "hetmem", ["configs/test.yaml"]).read_text()
    head = re.search(r"<h3 class='gpu-record' data-gpu='h200'>(.*?)</h3>", page).group(1)
    assert head == f"recorded on NVIDIA H200 (2026-05-02, commit {COMMIT[:12]}); current"
    assert "2/3 claims held on that GPU" in page
    rows = [(c, status) for status, c in re.findall(r"<tr class='(\w+)' data-claim='(\w+)'>", page)]
    assert rows == [("tier_order", "passed"), ("prefetch_hides", "passed"), ("nvme_tier", "not_measured")]
    tier = re.search(r"data-claim='tier_order'>.*?</tr>", page).group(0)
    assert "PASS" in tier and "&quot;ratio&quot;: 14.2" in tier
    nvme = re.search(r"data-claim='nvme_tier'>.*?</tr>", page).group(0)
    assert "NOT MEASURED" in nvme and "point nvme-4 failed: ENOSPC" in nvme
    # No record for a study, or no records at all: the page has no GPU section.
    cfg_none = {**cfg, "data": {"resources_dir": str(tmp_path / "nothing")}}
    assert "gpu-record" not in about.write(TOY_HETMEM, cfg_none, res / "hetmem", []).read_text()


def test_the_about_stage_of_a_real_study_finds_the_config_s_records(tmp_path, write_config, capsys):
    """The command the <study>_about rule runs: the study's config names resources_dir."""
    resources = tmp_path / "resources"
    import_records(hand_made_run(tmp_path), resources / "gpu-records")
    config = write_config(studies=["hetmem"], data={"resources_dir": str(resources)})
    assert cli.main(["hetmem", "about", "--config", str(config)]) == 0
    page = (tmp_path / "results" / "hetmem" / "about.html").read_text()
    assert f"recorded on NVIDIA H200 (2026-05-02, commit {COMMIT[:12]})" in page
    assert gpu_records.records_root({"data": {"resources_dir": "resources"}}) == "resources/gpu-records"
    assert gpu_records.records_root({}) is None


def test_a_study_measured_on_the_gpu_machines_cpu_says_so(tmp_path):
    run = hand_made_run(tmp_path)
    side = run / "microbatch" / "runs.provenance.json"
    rec = json.loads(side.read_text())
    rec.pop("gpu_model")
    side.write_text(json.dumps({**rec, "device": "cpu"}))
    root = tmp_path / "records"
    import_records(run, root)
    (entry,) = gpu_records.study_records(root, "microbatch")
    assert gpu_records.label(entry) == (f"recorded on NVIDIA H200 (2026-05-02, commit {COMMIT[:12]}); its "
                                        "tables say measured on CPU: AMD EPYC 9654 (16 cores); older code "
                                        "(these files changed: hpcdl/studies/microbatch/compute.py, "
                                        "configs/gpu.yaml (microbatch block))")


def test_the_about_and_verdict_rules_read_the_committed_records(tmp_path):
    """A Snakemake dry run in a workdir holding a record: the study's about rule and the verdict list
    the record's files as inputs (so a new or changed record reruns them)."""
    from workflow_run import snakemake

    workdir = tmp_path / "wd"
    import_records(hand_made_run(tmp_path, studies=("hetmem",)), workdir / "resources" / "gpu-records")
    dry = snakemake(workdir, "--config", "studies=[hetmem,microbatch]", "-n", "--verbose",
                    "verdict", "hetmem_about", "microbatch_about", timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    inputs = dict(re.findall(r"^(?:local)?rule (\w+):\n\s+input: (.*)$", dry.stdout + dry.stderr, re.M))
    record = ["resources/gpu-records/h200/record.json", "resources/gpu-records/h200/hetmem/claims.json"]
    for rule in ("verdict", "hetmem_about"):
        assert inputs[rule].split(", ")[-2:] == record, (rule, inputs[rule])
    # microbatch has no record on that GPU: its page reads only the record.json that says so
    assert inputs["microbatch_about"].split(", ")[-1] == record[0]
    assert "gpu-records/h200/hetmem" not in inputs["microbatch_about"]


def test_the_record_keeps_each_study_s_duration_and_fingerprint_and_why_one_was_left_out(tmp_path):
    """record.json's duration_s is how long the study's Snakemake call ran (gpu_run's summary.json), not
    when its tables were written; a study killed at the call's limit is named with its seconds."""
    run = hand_made_run(tmp_path)
    (run / "summary.json").write_text(json.dumps([
        {"step": "setup", "exit": 0, "seconds": 12.0},
        {"step": "studies", "exit": 124, "seconds": 600.0, "per_study": {
            "hetmem": {"seconds": 90.5, "exit": 0}, "microbatch": {"seconds": 54.0, "exit": 1},
            "offload": {"seconds": 455.6, "exit": 124}}}]))
    rec = json.loads((import_records(run, tmp_path / "records") / "record.json").read_text())
    assert rec["studies"]["hetmem"]["duration_s"] == 90.5
    assert "duration_s" not in rec["studies"]["microbatch"]  # its call failed: no duration to plan by
    assert rec["imports"][-1]["not_imported"]["offload"] == (
        "no claims.json (its claims stage did not finish on the GPU); its call ran 456 s, exit 124")
    fp = rec["studies"]["hetmem"]["fingerprint"]
    assert fp["from"] == "the run's working tree" and fp["commit"] == COMMIT
    assert fp["files"] == record_state.tree_fingerprint(REPO, "hetmem")["files"]
