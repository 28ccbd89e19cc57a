"""A study's about page (docs/architecture.md, "Report"; issue #60 items 7 and 8): each claim of this run
with its confirmation and its `tuned` note, as the landing page's claim lines show them, and which paper
figure each of the study's figures re-draws (StudySpec.paper_figures).

HAND-MADE: the claims below are written by hand into a claims.json (no study ran), in the shape
hpcdl.platform.kit.claims.write_claims gives them (`confirmation` from
hpcdl.platform.kit.confirmation, `tuned`: [{key, why}]); the toy StudySpec is hand-made too. Only the
paper-figure declarations checked for every registered study are the studies' own.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from hpcdl.platform.kit.claims import claim, not_measured
from hpcdl.platform.kit.config import load_config
from hpcdl.platform.kit.confirmation import describe
from hpcdl.platform.kit.study import StudySpec, registered
from hpcdl.platform.orchestration import about, claim_lines

REPO = Path(__file__).resolve().parent.parent
SPECS = registered()

TOY = StudySpec(name="toy", title="Toy study (hand-made spec)", raw_tables=("points",), tables=("squares",),
                figures=("speed", "memory"), task_units=lambda cfg: 1, run_resources=lambda cfg: {},
                question="Is the toy fast?", headline="speed", setting=lambda cfg: "2 points",
                paper_figures={
                    "speed": "Toy et al. 2020, Fig. 3: speedup against ranks; ours on 2 ranks, not 64.",
                    "Toy et al. 2020, Fig. 5": "energy per step: this machine has no power meter.",
                })

# HAND-MADE claims: one judged on unseen seeds and tuned against, one judged on seeds tuning also saw,
# one without confirmation seeds (a timing measured afresh), one not measured.
UNSEEN = {"seeds": [3, 4], "key": "seeds", "exploration": [0, 1], "unseen": True}
SEEN = {"seeds": [0, 5], "key": "knobs.seeds", "exploration": [0], "unseen": False}
AFRESH = {"none": "timings of this run's steps, measured afresh: no seed decides them"}
TUNED = [{"key": "toy.claims.min_speedup", "why": "1.5 -> 1.3 after the 2026-11-20 run read 1.41"},
         {"key": "toy.repeats", "why": "3 -> 5: one slow repeat decided the verdict"}]


def _claims() -> list[dict]:
    fast = claim("speedup_over_1", "two ranks beat one", True, speedup=1.62, threshold=1.3)
    exact = claim("exact_gap", "partitioned equals whole", False, gap=0.2, threshold=0.1)
    timing = claim("hidden_fraction", "copies hide behind compute", True, hidden_fraction=0.91, threshold=0.7)
    missing = not_measured("memory_ratio", "offload halves memory", "point p2 failed: out of memory")
    return [{**fast, "confirmation": UNSEEN, "tuned": TUNED}, {**exact, "confirmation": SEEN},
            {**timing, "confirmation": AFRESH}, missing]


def _write_run(study_dir: Path) -> None:
    study_dir.mkdir(parents=True)
    doc = {"study": "toy", "claims": _claims(), "passed": 2, "failed": 1, "straddles": 0, "not_measured": 1,
           "total": 4, "measured_on": "CPU: hand-made (2 cores)"}
    (study_dir / "claims.json").write_text(json.dumps(doc))


def _page(tmp_path: Path, spec: StudySpec = TOY, cfg: dict | None = None, run: bool = True) -> str:
    study_dir = tmp_path / "results" / spec.name
    if run:
        _write_run(study_dir)
    else:
        study_dir.mkdir(parents=True)
    cfg = cfg if cfg is not None else {"results_dir": str(tmp_path / "results"), spec.name: {}}
    return about.write(spec, cfg, study_dir, ["configs/test.yaml"], gpu_records_root=tmp_path / "no-records",
                       papers=tmp_path / "no-papers.yaml").read_text()


def _row(page: str, claim_id: str) -> str:
    found = re.search(rf"<tr class='run-claim \w+' data-run-claim='{claim_id}'.*?</tr>", page, re.S)
    assert found, f"no row for {claim_id} on the about page"
    return found.group(0)


def test_a_claim_with_confirmation_and_tuned_shows_both_on_the_about_page(tmp_path):
    page = _page(tmp_path)
    rows = re.findall(r"<tr class='run-claim (\w+)' data-run-claim='(\w+)'", page)
    assert rows == [("passed", "speedup_over_1"), ("failed", "exact_gap"), ("passed", "hidden_fraction"),
                    ("not_measured", "memory_ratio")]
    # the claims come after the setting, and before the paper figures
    assert page.index("class='setting'") < page.index("id='run-claims'") < page.index("id='paper-figures'")

    tuned = _row(page, "speedup_over_1")
    # the landing line's mark beside the status word, and the line's number (claim_lines.readable)
    assert re.search(r"<b>PASS</b> <b title='tuned after seeing it'>· TUNED</b></td>", tuned), tuned
    assert html.escape(claim_lines.readable(_claims()[0])) in tuned
    # its confirmation as the landing line words it, marked unseen
    assert "<small class='confirmation unseen'>" in tuned
    assert html.escape(describe(UNSEEN)) in tuned
    assert "confirmed on unseen seeds 3, 4 (seeds; exploration: 0, 1)" in tuned
    # and each tuned note: the key and why
    for note in TUNED:
        assert f"<code>{html.escape(note['key'])}</code>: {html.escape(note['why'])}" in tuned
    assert tuned.count("<small class='tuned'>") == 2

    seen = _row(page, "exact_gap")
    assert "TUNED" not in seen and "class='tuned'" not in seen
    assert "<small class='confirmation'>" in seen  # not unseen
    assert html.escape("judged on seeds 0, 5 (knobs.seeds), not unseen: 0 also shaped choices") in seen
    afresh = _row(page, "hidden_fraction")
    assert html.escape("no confirmation seeds: timings of this run's steps, measured afresh") in afresh
    missing = _row(page, "memory_ratio")
    assert "point p2 failed: out of memory" in missing and "class='confirmation" not in missing
    # the words are defined beside the table, in the landing page's legend's own words
    assert html.escape(claim_lines.TUNED) in page and html.escape(claim_lines.UNSEEN) in page


def test_a_run_without_claims_has_no_claims_table(tmp_path):
    page = _page(tmp_path, run=False)
    assert "id='run-claims'" not in page and "data-run-claim" not in page
    assert "No answer from this run yet" in page


def test_the_about_page_lists_ours_beside_the_paper_figure_and_the_paper_figures_without_one(tmp_path):
    page = _page(tmp_path)
    section = page[page.index("id='paper-figures'"):]
    shown = re.findall(r"<tr class='figure-source' data-our-figure='(\w+)'><td>[^<]*</td><td>(.*?)</td></tr>",
                       section)
    assert shown == [("speed", html.escape(TOY.paper_figures["speed"])),
                     ("memory", "not declared (StudySpec.paper_figures)")]
    missing = re.search(r"<li data-paper-figure='([^']*)'><b>[^<]*</b>: (.*?)</li>", section)
    assert missing and html.unescape(missing.group(1)) == "Toy et al. 2020, Fig. 5"
    assert html.unescape(missing.group(2)) == "energy per step: this machine has no power meter."


# A paper figure is named with its number ("Fig. N") only where it is known; otherwise the entry says so.
KNOWN = re.compile(r"\bFig(ure|\.)\s*\d+")
UNKNOWN = "no direct counterpart identified in "


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_study_declares_the_paper_figure_of_each_of_its_figures(name):
    spec = SPECS[name]
    figures = dict(spec.paper_figures)
    absent = [f for f in spec.figures if not str(figures.get(f, "")).strip()]
    assert not absent, f"hpcdl/studies/{name}/__init__.py: SPEC.paper_figures declares nothing for {absent}"
    for figure in spec.figures:
        text = figures[figure]
        assert KNOWN.search(text) or UNKNOWN in text, (
            f"{name}.{figure}: name the paper figure (\"<paper>, Fig. N: ...\") or say "
            f"\"{UNKNOWN}<paper>\": {text!r}")
    # a key that is not one of ours names a paper figure (with no counterpart here), never a misspelt figure
    for key, why in figures.items():
        if key not in spec.figures:
            assert not key.isidentifier() and why.strip(), (
                f"{name}: paper_figures key {key!r} is not one of its figures {spec.figures}")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_studys_about_page_lists_its_figures_with_their_paper_figures(name, tmp_path):
    spec = SPECS[name]
    cfg = {"results_dir": str(tmp_path / "results"), **load_config(REPO / "configs" / "test.yaml")}
    page = _page(tmp_path, spec, cfg, run=False)
    section = page[page.index("id='paper-figures'"):]
    shown = dict(re.findall(r"<tr class='figure-source' data-our-figure='(\w+)'><td>[^<]*</td><td>(.*?)</td>",
                            section))
    assert list(shown) == list(spec.figures)
    for figure in spec.figures:
        assert html.unescape(shown[figure]) == spec.paper_figures[figure]
