"""What the three analysis stages of every study share: reading what an earlier stage wrote, saying
why a point has no result, the ok rows of a raw table, pyplot (docs/architecture.md, "Stages").

A study's `tables.py`, `figures.py` and `claims.py` use these instead of keeping copies.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from hpcdl.platform.kit.sidecars import read_sidecars
from hpcdl.platform.kit.study_dir import StudyDir

ERROR_CHARS = 300  # of a failed point's last error line, in a claim's reason


def read_or_empty(path: str | Path, columns: list[str] | None = None) -> pd.DataFrame:
    """The table at `path`, or an empty one (with `columns`) where there is no file or no content.

    An earlier stage writes no rows when every point it needed failed; the claims that read it are
    then not measured, never a crash.
    """
    try:
        return pd.read_csv(path)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame(columns=columns)


def read_tables(study_dir: str | Path, *names: str, folder: str = "tables") -> list[pd.DataFrame]:
    """`read_or_empty` of each table `<study_dir>/<folder>/<name>.csv`, in the order named."""
    run = StudyDir(study_dir)
    return [read_or_empty(run.table(name, folder)) for name in names]


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of a raw table whose point succeeded (all rows where there is no status column)."""
    if df.empty or "status" not in df:
        return df.copy()
    return df[df["status"] == "ok"].copy()


def last_error_line(error) -> str:
    """The last non-blank line of a failed point's error (the exception), cut to ERROR_CHARS."""
    lines = [ln for ln in str(error).strip().splitlines() if ln.strip()]
    return (lines or ["no error text"])[-1][:ERROR_CHARS]


def failed_because(what: str, error) -> str:
    """A not-measured reason: `<what> failed: <the error's last line>`."""
    return f"{what} failed: {last_error_line(error)}"


FAILURE_COLUMNS = ["kind", "point", "error"]


def failures_table(raws: dict[str, pd.DataFrame], keys: tuple[str, ...]) -> pd.DataFrame:
    """Every failed point of the raw tables `raws` (kind -> table): its kind, its point as
    "k=v, k=v" over the `keys` it has, and its error. The claims stage reads it back with
    `why_point_missing`."""
    rows = []
    for kind, df in raws.items():
        if "status" not in df:
            continue
        for _, r in df[df["status"] == "failed"].iterrows():
            point = {k: r[k] for k in keys if k in r and pd.notna(r[k])}
            rows.append({"kind": kind, "point": ", ".join(f"{k}={v}" for k, v in point.items()),
                         "error": r["error"]})
    return pd.DataFrame(rows, columns=FAILURE_COLUMNS)


def why_point_missing(fails: pd.DataFrame, kind: str, **point) -> str:
    """Why a point has no measurement: the failure `failures_table` recorded for it (its error's
    last line), or that it is absent."""
    keys = [f"{k}={v}" for k, v in point.items()]
    label = ", ".join(keys)
    for r in fails[fails["kind"] == kind].itertuples():
        if all(k in str(r.point).split(", ") for k in keys):
            return failed_because(f"point {label}", r.error)
    return f"point {label} is not in the table"


def started_at(study_dir: str | Path, raw_table: str) -> float:
    """When the task app started writing `raw/<raw_table>.csv` (its sidecar), else now.

    A derived table's provenance spans the whole run from the app's start to the stage's end.
    """
    for record in read_sidecars(StudyDir(study_dir).raw, raw_table):
        try:
            return pd.Timestamp(record["start_time"]).timestamp()
        except (KeyError, ValueError):
            break
    return time.time()


def pyplot():
    """matplotlib.pyplot, on the backend MPLBACKEND names (the CLI sets Agg where nothing is set).

    Log axes label 0.001 to 1000 as plain numbers (200, not 2x10^2): easier to read off a figure.
    """
    import matplotlib.pyplot as plt

    plt.rcParams["axes.formatter.min_exponent"] = 4
    return plt
