"""`python -m hpcdl compare-verdicts`: consecutive runs' claims.json files, compared claim by claim."""

import subprocess
import sys

from hpcdl.platform.kit.claims import claim, not_measured, write_claims
from hpcdl.platform.kit.intervals import above, mean_interval
from hpcdl.platform.orchestration import verdict_compare


def _run(root, speedups: list[float], with_pruning: bool = True):
    """One run's results dir: study `demo` with an interval claim on `speedups` (line 1.0), a plain
    claim, and optionally a not-measured one."""
    iv = mean_interval(speedups)
    claims = [claim("faster", "the plan is faster than the default", above(iv, 1.0),
                    speedup=iv.evidence(4), threshold=1.0),
              claim("exact", "outputs equal", True, max_error=0.0)]
    if with_pruning:
        claims.append(not_measured("pruning", "pruning saves time", "demo.pruning is off"))
    (root / "demo").mkdir(parents=True)
    write_claims(root / "demo", "demo", claims)
    return root


def test_runs_with_one_verdict_per_claim_exit_0(tmp_path, capsys):
    a = _run(tmp_path / "a", [1.10, 1.12, 1.11])
    b = _run(tmp_path / "b", [1.09, 1.13, 1.12])
    assert verdict_compare.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"run 1 ({a}): not measured 1, passed 2" in out
    assert "3 of 3 claims had the same verdict in all 2 runs" in out
    assert "moved" not in out


def test_a_claim_that_moved_is_named_with_each_runs_number(tmp_path, capsys):
    a = _run(tmp_path / "a", [1.10, 1.12, 1.11])
    b = _run(tmp_path / "b", [0.95, 1.10, 1.02])            # crosses 1.0: straddles
    c = _run(tmp_path / "c", [1.10, 1.12, 1.11], with_pruning=False)
    assert verdict_compare.main([str(a), str(b), str(c)]) == 1
    out = capsys.readouterr().out
    assert f"run 2 ({b}): not measured 1, passed 1, straddles 1" in out
    assert "1 of 3 claims had the same verdict in all 3 runs" in out
    assert "moved: demo.faster: passed / straddles / passed" in out
    assert "moved: demo.pruning: not_measured / not_measured / absent" in out
    # each run's line under a moved claim carries its own number and interval
    assert "  run 1: passed: speedup 1.11 [" in out and "  run 2: straddles: speedup 1.023 [" in out


def test_a_per_item_claim_names_the_items_that_did_not_hold():
    c = {"id": "oracle_error", "status": "straddles",
         "measured": {"holds": {"weak": True, "train": "straddles", "hybrid": False, "strong": "holds"}}}
    assert verdict_compare.not_holding(c) == ["train straddles", "hybrid fails"]
    assert verdict_compare.not_holding({"id": "x", "status": "passed", "measured": {"speedup": 2.0}}) == []


def test_a_directory_without_claims_or_with_a_broken_file_is_named(tmp_path, capsys):
    a = _run(tmp_path / "a", [1.10, 1.12, 1.11])
    empty = tmp_path / "empty"
    empty.mkdir()
    assert verdict_compare.main([str(a), str(empty)]) == 2
    assert f"{empty}: no <study>/claims.json in it" in capsys.readouterr().err
    broken = tmp_path / "broken" / "demo"
    broken.mkdir(parents=True)
    (broken / "claims.json").write_text("{not json")
    assert verdict_compare.main([str(a), str(broken.parent)]) == 2
    assert f"{broken / 'claims.json'}: not a readable claims file" in capsys.readouterr().err
    (broken / "claims.json").write_text('{"study": "demo", "claims": [{"id": "x"}]}')
    assert verdict_compare.main([str(broken.parent)]) == 2
    assert "has no list of claims with an id and a status each" in capsys.readouterr().err


def test_the_command_line_runs_it(tmp_path):
    a = _run(tmp_path / "a", [1.10, 1.12, 1.11])
    b = _run(tmp_path / "b", [0.95, 1.10, 1.02])
    done = subprocess.run([sys.executable, "-m", "hpcdl", "compare-verdicts", str(a), str(b)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "moved: demo.faster: passed / straddles" in done.stdout
