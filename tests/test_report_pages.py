"""The report's study pages and its paper-vs-ours rows in a real browser (docs/architecture.md, "Report").

The test-scale report (tests/workflow_run.py, built with workflows/report/report.css as `make report`
builds it) in headless Chromium at 1280x900 and 1920x1080 px:

- every study's link on the landing page opens its about page beside its category; the menu keeps to
  a quarter of the window, the page shows the study's full title, its question, an answer computed
  from this run's claims, the setting and the headline figure at least 60 % of the window wide, and
  nothing covers the question, the answer or the figure (neither inside the page nor over its frame);
- a figure opened on its own and a result's details keep the menu to a quarter of the window;
- the landing page has every published result of resources/papers.yaml as a paper-vs-ours row.

Screenshots of the landing page and of one study page at each width are kept beside the report.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from chromium import Chromium, PageError, chromium_or_skip

from hpcdl.platform.kit.study import registered
from hpcdl.platform.orchestration.about import ABOUT, report_label
from hpcdl.platform.orchestration.paper_vs_ours import load

SIZES = [(1280, 900), (1920, 1080)]
SHOWN_STUDY = "spatial"  # the study page kept as a screenshot (docs/report-study-1280.png)
SCALE, SCALE_FILE = "test", "test.yaml"  # the fixture's config (tests/workflow_run.py)

READY = "document.querySelector('#hpcdl-verdict') !== null && typeof app !== 'undefined' && !!app"

# Where the report puts its navigation and the frame of an HTML result, and whether the frame is what
# the window shows at its centre.
TOP = """(() => {
  const box = el => { if (!el) return null; const b = el.getBoundingClientRect();
                      return {left: b.left, right: b.right, top: b.top, bottom: b.bottom, width: b.width}; };
  const nav = document.querySelector('nav'), frame = document.querySelector('iframe');
  return {window: innerWidth, nav: box(nav), frame: box(frame), navText: nav ? nav.innerText : ''};
})()"""

# The about page once loaded in the frame (its figure decoded): title, texts, widths.
PAGE = """(() => {
  const h1 = document.querySelector('h1.study-title'), img = document.querySelector('figure.headline img');
  const loaded = img && img.complete && img.naturalWidth > 0;
  if (!h1 || document.readyState !== 'complete' || (img && !loaded)) return null;
  const text = sel => { const el = document.querySelector(sel); return el ? el.innerText : null; };
  return {study: h1.dataset.study, title: h1.innerText, question: text('p.question'),
          answer: text('p.answer'), setting: text('p.setting'),
          figure: img ? img.getBoundingClientRect().width : null,
          width: innerWidth, scrollWidth: document.documentElement.scrollWidth};
})()"""


def _shown(selector: str) -> str:
    """JavaScript for the frame: scroll `selector` to the top of the frame, then its box and whether
    the element at the middle of its visible part is itself (or inside it)."""
    return f"""(() => {{
      const el = document.querySelector({json.dumps(selector)});
      if (!el) return null;
      el.scrollIntoView({{block: 'start'}});
      const b = el.getBoundingClientRect();
      const x = b.left + b.width / 2, y = Math.max(b.top, 0) + Math.min(b.height, innerHeight) / 2;
      const hit = document.elementFromPoint(x, y);
      return {{x, y, width: b.width, right: b.right, own: !!hit && (hit === el || el.contains(hit))}};
    }})()"""


def _frame_hit(x: float, y: float) -> str:
    return f"document.elementFromPoint({x}, {y}) === document.querySelector('iframe')"


@pytest.fixture(scope="session")
def chromium_exe() -> str:
    return chromium_or_skip()


def _wait_in_frame(browser: Chromium, expression: str, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = browser.evaluate_in_frame(expression)
        except PageError:  # the frame is being replaced (each view change makes a new one)
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise PageError(f"timed out after {timeout} s waiting for {what}")


def _open(browser: Chromium, report: Path, width: int, height: int) -> None:
    browser.set_viewport(width, height)
    browser.navigate(report.as_uri())
    browser.wait_for(READY, what="the report app and its verdict table")


def _click_result(browser: Chromium, label: str, button: int) -> None:
    """Click a button (0: view, 1: details) of the category's result labelled `label`."""
    browser.evaluate(f"""[...document.querySelectorAll('table.table-auto tbody tr')]
        .find(r => r.querySelector('td').innerText.trim() === {json.dumps(label)})
        .querySelectorAll('td:last-child a')[{button}].click()""")


@contextmanager
def _report_in_chromium(chromium_exe: str, wf, tmp_path: Path, width: int, height: int):
    """A Chromium at width x height, closed after, once the test-scale workflow has made its report."""
    assert wf.made is not None and wf.made.returncode == 0, wf.run.stderr[-3000:]
    browser = Chromium(chromium_exe, tmp_path / "profile", width=width, height=height)
    try:
        yield browser
    finally:
        browser.close()


@pytest.mark.slow
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_every_study_page_fits_the_window(chromium_exe, test_scale_workflow, tmp_path, width, height):
    wf = test_scale_workflow
    with _report_in_chromium(chromium_exe, wf, tmp_path, width, height) as browser:
        for study in wf.studies:
            spec, doc = registered()[study], json.loads((wf.results / study / "claims.json").read_text())
            _open(browser, wf.report, width, height)
            browser.evaluate(f"document.querySelector('tbody.study[data-study=\"{study}\"] a').click()")
            page = _wait_in_frame(browser, PAGE, f"{study}'s about page")
            top = browser.evaluate(TOP)
            nav, frame = top["nav"], top["frame"]
            where = (study, width, top, page)
            # The menu: a quarter of the window at most, the study under its short title; the page
            # beside it, up to the window's right edge, under the full title.
            assert top["window"] == width and nav["width"] <= 0.25 * width + 0.5, where
            assert frame["left"] >= nav["right"] - 0.5 and frame["right"] <= width + 0.5, where
            assert spec.category in top["navText"], where
            assert (page["study"], page["title"]) == (study, spec.title), where
            assert page["scrollWidth"] <= page["width"], where  # nothing runs off to the right
            # Question, answer from this run's claims, setting, the headline figure 60 % of the window.
            assert page["question"] == f"Question. {spec.question}", where
            held = sum(c["status"] == "passed" for c in doc["claims"])
            assert f"{held} of {len(doc['claims'])} claims hold" in page["answer"], where
            assert doc["measured_on"] in page["answer"] and f"{SCALE} scale" in page["answer"], where
            assert all(c["id"] in page["answer"] for c in doc["claims"]), where
            assert f"configs/{SCALE_FILE}" in page["setting"] and "seeds:" in page["setting"], where
            assert page["figure"] >= 0.6 * width, where
            # Nothing covers them: in the page, and over the frame where the page shows them.
            for part in ("p.question", "p.answer", "figure.headline img"):
                shown = browser.evaluate_in_frame(_shown(part))
                assert shown and shown["own"] and shown["right"] <= page["width"], (part, where, shown)
                assert browser.evaluate(_frame_hit(frame["left"] + shown["x"], frame["top"] + shown["y"])), \
                    (part, where, shown)
            if study == SHOWN_STUDY or study == wf.studies[0] and SHOWN_STUDY not in wf.studies:
                browser.evaluate_in_frame("window.scrollTo(0, 0)")
                shot = browser.screenshot(wf.report.with_name(f"report-study-{width}.png"))
                assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            # The other views of the category keep the menu to a quarter: a figure on its own, a
            # result's details (Snakemake widens the menu to half the window for those).
            _click_result(browser, report_label(spec, spec.headline), 0)
            browser.wait_for("(() => { const i = document.querySelector('div.grow.h-screen img');"
                             " return !!i && i.complete && i.naturalWidth > 0; })()", what="the figure")
            figure = browser.evaluate(TOP)
            assert figure["nav"]["width"] <= 0.25 * width + 0.5, (study, "figure view", figure)
            _click_result(browser, report_label(spec, ABOUT), 1)
            browser.wait_for("app.state.navbarMode === 'resultinfo'", what="the result's details")
            assert browser.evaluate(TOP)["nav"]["width"] <= 0.25 * width + 0.5, (study, "details")


@pytest.mark.slow
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_the_landing_page_has_every_published_row(chromium_exe, test_scale_workflow, tmp_path, width, height):
    wf = test_scale_workflow
    with _report_in_chromium(chromium_exe, wf, tmp_path, width, height) as browser:
        _open(browser, wf.report, width, height)
        shot = browser.screenshot(wf.report.with_name(f"report-landing-{width}.png"))
        rows = browser.evaluate("""[...document.querySelectorAll('#hpcdl-paper tr.paper-row')].map(r => {
            const b = r.getBoundingClientRect();
            return {study: r.dataset.study, id: r.dataset.paper, width: b.width, right: b.right,
                    verdict: r.lastElementChild.innerText};
          })""")
    published = [(study, item["id"]) for study, items in load().items() for item in items]
    assert [(r["study"], r["id"]) for r in rows] == published
    for r in rows:  # drawn, within the window, each with its verdict
        assert r["width"] > 0 and r["right"] <= width + 0.5 and r["verdict"].strip(), r
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
