"""Each figure's caption, written from the run (docs/architecture.md, "Report").

A figure's caption in the report has two parts:

- `workflows/report/<study>/<figure>.rst`, fixed: what to look at. It states no outcome (a run
  computes those: its claims and figures say them) and starts with `include_line`, which pulls in
- `<study_dir>/figures/<figure>.run.rst`, written by the figures stage after the study has drawn its
  figures (`write`): this run's scale (its config files), the device it was measured on (the
  provenance sidecars), the config's seeds; for a model-only figure (drawn with
  `save_figure(..., model_only=True)`, which records it in the PNG) that it is a model and nothing in
  it is measured.

Snakemake renders a caption with Jinja2 (`snakemake.config` is the workflow's config) and then
docutils, from the directory the report is built in, where `results_dir` is relative to; the study's
about page (hpcdl.platform.orchestration.about) shows its headline figure with the same two parts.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from hpcdl.platform.kit.atomic import atomic_write_text
from hpcdl.platform.kit.results import MODEL, figure_basis
from hpcdl.platform.kit.study import StudySpec
from hpcdl.platform.kit.study_dir import StudyDir

RUN_SUFFIX = ".run.rst"  # <study_dir>/figures/<figure>.run.rst
SEED_KEY = re.compile(r"^(seed|seeds|\w+_seeds?)$")


def run_caption(study_dir: str | Path, figure: str) -> Path:
    """Where the figures stage writes the run's part of `figure`'s caption."""
    return StudyDir(study_dir).figures / f"{figure}{RUN_SUFFIX}"


def include_line(study: str, figure: str) -> str:
    """The first line of workflows/report/<study>/<figure>.rst: the run's part, by docutils' include,
    under the config's results_dir (Jinja2, rendered by Snakemake's report)."""
    return f'.. include:: {{{{ snakemake.config["results_dir"] }}}}/{study}/figures/{figure}{RUN_SUFFIX}'


def seeds(block: dict, prefix: str) -> list[str]:
    """Every seed setting of a study's config block, "<key path> <values>", in the block's order."""
    found = []
    for key, value in block.items():
        path = f"{prefix}.{key}"
        if key == "exploration" and path.count(".") == 1:
            continue  # the seeds earlier runs tuned on, not this run's (hpcdl.platform.kit.confirmation)
        if isinstance(value, dict):
            found += seeds(value, path)
        elif SEED_KEY.match(str(key)) and value is not None:
            shown = value if isinstance(value, list | tuple) else [value]
            found.append(f"{path} {', '.join(map(str, shown))}")
    return found


def scale(config_files: list[str]) -> str:
    """The run's scale, named from its config files (configs/default.yaml: laptop), and the files."""
    from hpcdl.platform.orchestration.paper_vs_ours import scale_of

    files = ", ".join(config_files)
    return f"{scale_of(config_files)} scale ({files})" if files else "scale unknown (no config file named)"


def facts(spec: StudySpec, cfg: dict, study_dir: str | Path, config_files: list[str]) -> dict:
    """What a caption and the about page say of the run: scale, device, seeds (plain text)."""
    found = seeds(cfg.get(spec.name) or {}, spec.name)
    return {"scale": scale(list(config_files)),
            "device": StudyDir(study_dir).measured_on() or "an unknown device (no provenance sidecars)",
            "seeds": "; ".join(found) if found else "none in the config (nothing random is drawn)"}


def run_sentence(f: dict, basis: str) -> tuple[str, str]:
    """(label, sentence) of a figure: "This run" with its scale, device and seeds, or "Model" where the
    figure is model-only (nothing in it measured)."""
    if basis == MODEL:
        return ("Model, not measured", f"computed at {f['scale']} from the config and this run's tables "
                                       f"(the run measured on {f['device']}); nothing in this figure is a "
                                       "measurement.")
    return "This run", f"{f['scale']}, measured on {f['device']}; seeds: {f['seeds']}."


_RST_SPECIAL = re.compile(r"([\\*`|_<>\[\]])")


def _rst(text: str) -> str:
    """Plain text as reStructuredText: inline markup characters escaped."""
    return _RST_SPECIAL.sub(r"\\\1", text)


def write(spec: StudySpec, cfg: dict, study_dir: str | Path, config_files: list[str]) -> list[Path]:
    """The run's part of every figure's caption (`run_caption`), for the figures drawn in study_dir."""
    f = facts(spec, cfg, study_dir, config_files)
    written = []
    for figure in spec.figures:
        png = StudyDir(study_dir).figure(figure)
        label, sentence = run_sentence(f, figure_basis(png))
        written.append(atomic_write_text(run_caption(study_dir, figure), f"**{label}:** {_rst(sentence)}\n"))
    return written


def static_text(spec: StudySpec, figure: str) -> str:
    """What to look at in `figure`: its caption file without the include line ("" without a file)."""
    path = spec.caption(figure)
    text = path.read_text() if path.is_file() else ""
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith(".. include::")).strip()


def html_caption(spec: StudySpec, study_dir: str | Path, figure: str) -> str:
    """The figure's whole caption as HTML: the run's part (as the figures stage wrote it) and what to
    look at, rendered by docutils as the report renders it."""
    from docutils.core import publish_parts

    run = run_caption(study_dir, figure)
    head = run.read_text() if run.is_file() else "**This run:** no caption written (figures stage not run)."
    body = publish_parts(f"{head}\n\n{static_text(spec, figure)}\n", writer="html",
                         settings_overrides={"report_level": 5, "file_insertion_enabled": False,
                                             "raw_enabled": False})["body"]
    return body or f"<p>{html.escape(head)}</p>"
