"""Shared by the benchmark scripts: print a table of ratios and optionally save it as CSV."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from hpcdl.platform.task_app import atomic_write_text


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--csv", type=Path, help="also write the table to this CSV file")
    return p


def emit(rows: list[dict], csv: Path | None) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if csv:
        atomic_write_text(csv, df.to_csv(index=False))
    return df
