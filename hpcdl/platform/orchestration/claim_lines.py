"""Every claim of a run in one line each, for the report's landing page (docs/architecture.md, "Report"):
its status word, one readable number with its interval where it has one, and a link to its evidence
(the study's claims page). Also the colour of a study's count (its worst status) and the legend that
defines the words.

`readable` picks the number a claim was decided on from its measured values (hpcdl.platform.kit.claims):
an interval ({mean, ci95, n}, hpcdl.platform.kit.intervals) before a plain number, the key that shares
the most words with the claim's id, and of a per-X mapping the X that missed (or the range over all).
"""

from __future__ import annotations

import html
import json
import math
import re

from hpcdl.platform.kit.claims import SHOWN
from hpcdl.platform.kit.confirmation import describe

_E = html.escape
AMBER = "darkorange"
# measured keys that hold the line a claim is judged against, not the measured quantity
LINE_KEYS = re.compile(r"^(threshold|tolerance|required|floor|ceiling|bound|min_net)")
REASON_CHARS = 200
# words of a measured key that name a compared quantity (a claim's id often does not: "..._faster")
QUANTITY_WORDS = {"speedup", "ratio", "efficiency", "error", "saving", "gap", "accuracy", "frac", "fraction",
                  "change"}

LEGEND = (
    ("passed", "measured, and the measured values meet the claim's threshold"),
    ("failed", "measured, and they miss it: a finding of this run, not a crash"),
    ("straddles", "the 95 % interval of the compared quantity crosses the threshold: noise decides at "
                  "this scale, so neither a pass nor a fail"),
    ("not_measured", "an input is missing, failed or incomplete; the reason names it"),
)
TUNED = ("the config was changed after this claim's result was seen (its `tuned` note names the key "
         "and why): the claim no longer tests data that shaped nothing")
UNSEEN = ("judged on seeds (or inputs) that shaped no choice: none of them is among the exploration "
          "seeds the study's thresholds, grids and knobs were tuned on; otherwise the line names the seeds "
          "it was judged on, or why no seed decides it")


def worst_color(statuses) -> str:
    """The colour of a set of claims: red if one failed, amber if one straddles or is not measured,
    green if all passed (and gray for none)."""
    statuses = set(statuses)
    if not statuses:
        return "dimgray"
    if "failed" in statuses:
        return SHOWN["failed"][0]
    if statuses & {"straddles", "not_measured"}:
        return AMBER
    return SHOWN["passed"][0]


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", text.lower()) if len(w) >= 3 and not w.isdigit()}


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_interval(v) -> bool:
    return isinstance(v, dict) and _is_number(v.get("mean")) and any(k.startswith("ci") for k in v)


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _ci_key(iv: dict) -> str:
    return next(k for k in iv if k.startswith("ci"))  # "ci95" for a 95 % interval


def _crosses(iv: dict, line: float) -> bool:
    low, high = iv[_ci_key(iv)]
    return low <= line <= high


def interval_text(iv: dict) -> str:
    """'1.053 [0.9093, 1.197] (95 % CI, n=2)' from an interval's evidence."""
    key = _ci_key(iv)
    low, high = iv[key]
    return f"{_fmt(iv['mean'])} [{_fmt(low)}, {_fmt(high)}] ({key[2:]} % CI, n={iv.get('n', '?')})"


def _candidates(measured: dict):
    """(key, {x: value} or value, kind) of every number or interval among the measured values."""
    for key, v in measured.items():
        if key in ("holds", "missing") or LINE_KEYS.match(key):
            continue
        if _is_interval(v):
            yield key, v, "interval"
        elif _is_number(v):
            yield key, v, "number"
        elif isinstance(v, dict) and v:
            if all(_is_interval(x) for x in v.values()):
                yield key, v, "interval"
            elif all(_is_number(x) for x in v.values()):
                yield key, v, "number"
            elif all(isinstance(x, dict) and x and all(map(_is_interval, x.values())) for x in v.values()):
                # per item, several intervals (malleable's makespan and turnaround per policy)
                flat = {f"{item} {name}": iv for item, x in v.items() for name, iv in x.items()}
                yield key, flat, "interval"


def _line(measured: dict) -> str:
    for key, v in measured.items():
        if LINE_KEYS.match(key) and _is_number(v):
            return f"; {key} {_fmt(v)}"
    return ""


def readable(c: dict) -> str:
    """One readable number of a claim, with its interval where it has one (plain text)."""
    measured = c.get("measured") or {}
    if c["status"] == "not_measured":
        reason = c.get("reason", "not measured").removeprefix("not measured: ")
        return reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 1] + "…"
    holds = measured.get("holds") if isinstance(measured.get("holds"), dict) else {}
    missed = [str(x) for x, ok in holds.items() if ok is not True]
    own = _words(c["id"])
    found = list(_candidates(measured))
    if not found:
        return "no number in its evidence (see the claims page)"

    def rank(item):
        i, (key, v, kind) = item
        words = _words(key)
        score = len(own & words) + 1.5 * bool(words & QUANTITY_WORDS) + 0.5 * ("mean" in words)
        values = v.values() if isinstance(v, dict) else [v]
        floats = any(isinstance(x, float) for x in values)
        return (-score, kind != "interval", not floats, i)

    key, v, kind = min(enumerate(found), key=rank)[1]
    show = (lambda x: interval_text(x)) if kind == "interval" else _fmt
    if not isinstance(v, dict) or _is_interval(v):
        return f"{key} {show(v)}{_line(measured)}"
    # an item that does not hold; of a flattened item's intervals, one across the line first
    line = next((x for k, x in measured.items() if LINE_KEYS.match(k) and _is_number(x)), None)
    parts = sorted((k for k in v for x in missed if k.startswith(f"{x} ")),
                   key=lambda k: not (kind == "interval" and line is not None
                                      and _crosses(v[k], line)))
    pick = (next((x for x in missed if x in v), None) or next(iter(parts), None)
            or (next(iter(v)) if len(v) == 1 else None))
    if pick is not None:
        more = f" (1 of {len(v)})" if len(v) > 1 else ""
        return f"{key} [{pick}] {show(v[pick])}{more}{_line(measured)}"
    if kind == "number":
        return f"{key} {_fmt(min(v.values()))}–{_fmt(max(v.values()))} over {len(v)}{_line(measured)}"
    first = next(iter(v))
    return f"{key} [{first}] {show(v[first])} (+{len(v) - 1} more){_line(measured)}"


def evidence_link(title: str, claims_page: str) -> str:
    """A link that opens the study's claims page in the report app (its category where the app has no
    such entry)."""
    p, t = json.dumps(claims_page), json.dumps(title)
    js = (f"javascript:void(typeof results!=='undefined'&&results[{p}]?(app.showResultInfo({p}),"
          f"app.setView({{content:'html',contentPath:results[{p}].data_uri,resultPath:{p}}})):"
          f"app.showCategory({t}))")
    return f"<a href='{_E(js)}' data-evidence='{_E(claims_page)}'>claims page</a>"


def study_link(title: str, about_page: str, text: str) -> str:
    """A link that opens the study: its category in the menu and its about page in the content pane, in
    one update of the report app's state (two would race: the second reads the state before the first
    is applied); its category alone where the report has no such page."""
    p, t = json.dumps(about_page), json.dumps(title)
    js = (f"javascript:void(typeof results!=='undefined'&&results[{p}]?app.setView({{"
          f"navbarMode:isSingleSubcategory({t})?'subcategory':'category',category:{t},"
          f"subcategory:isSingleSubcategory({t})?Object.keys(categories[{t}])[0]:undefined,"
          f"content:'html',contentPath:results[{p}].data_uri,resultPath:{p}}}):app.showCategory({t}))")
    return f"<a href='{_E(js)}' data-about='{_E(about_page)}'>{_E(text)}</a>"


def _confirmation(c: dict) -> str:
    """Where the claim was confirmed (its claims.json `confirmation`), small, under its number."""
    if "confirmation" not in c:
        return ""
    unseen = " unseen" if c["confirmation"].get("unseen") else ""
    return f"<br><small class='confirmation{unseen}'>{_E(describe(c['confirmation']))}</small>"


def render_lines(entries: list[dict]) -> str:
    """Every claim of every study that ran, one line each (a table row): status, study, claim, its
    number, the link to its evidence. A study that did not run has one line saying so."""
    cell = "padding:2px 6px;vertical-align:top;text-align:left;overflow-wrap:anywhere"
    rows = []
    for e in entries:
        if e["state"] != "ran":
            rows.append(f"<tr class='claim-line not-run' data-study='{_E(e['study'])}'>"
                        f"<td style='{cell};color:dimgray'><b>NOT RUN</b></td><td style='{cell}'>"
                        f"{_E(e['study'])}</td><td style='{cell}' colspan='3'>no claims.json</td></tr>")
            continue
        for c in e.get("claims", []):
            color, word = SHOWN[c["status"]]
            if c["status"] == "not_measured":
                color = AMBER
            tuned = " <b title='tuned after seeing it'>· TUNED</b>" if c.get("tuned") else ""
            rows.append(
                f"<tr class='claim-line {c['status']}' data-study='{_E(e['study'])}' "
                f"data-claim-line='{_E(c['id'])}' data-status='{c['status']}'>"
                f"<td style='{cell};color:{color};white-space:nowrap'><b>{word}</b>{tuned}</td>"
                f"<td style='{cell}'>{_E(e['study'])}</td>"
                f"<td style='{cell}' title='{_E(c.get('statement', ''))}'>{_E(c['id'])}</td>"
                f"<td style='{cell}'>{_E(readable(c))}{_confirmation(c)}</td>"
                f"<td style='{cell}'>{evidence_link(e['title'], e['claims_page'])}</td></tr>")
    head = "".join(f"<th style='{cell}'>{h}</th>"
                   for h in ("result", "study", "claim", "measured", "evidence"))
    return ("<table id='hpcdl-claims' style='border-collapse:collapse;font-size:0.85rem;width:100%;"
            "table-layout:auto'><caption style='text-align:left;font-weight:bold'>Every claim of this "
            f"run, one line each</caption><thead><tr>{head}</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def render_legend() -> str:
    items = []
    for status, text in LEGEND:
        color, word = SHOWN[status]
        color = AMBER if status == "not_measured" else color
        items.append(f"<li data-legend='{status}'><b style='color:{color}'>{word}</b>: {_E(text)}</li>")
    items.append(f"<li data-legend='tuned'><b>TUNED</b>: {_E(TUNED)}</li>")
    items.append(f"<li data-legend='unseen'><b>confirmed on unseen seeds</b>: {_E(UNSEEN)}</li>")
    return ("<div id='hpcdl-legend' style='font-size:0.85rem'><b>What the words mean.</b> A study's count "
            f"is <b style='color:{SHOWN['failed'][0]}'>red</b> when a claim failed, <b style='color:{AMBER}'>"
            f"amber</b> when one straddles or is not measured (and none failed), <b style='color:"
            f"{SHOWN['passed'][0]}'>green</b> when all passed.<ul style='margin:2px 0 2px 1.2em'>"
            + "".join(items) + "</ul></div>")
