"""Where a run's numbers go: metrics.csv, TensorBoard event files, a console progress line."""

import csv
import logging
import math
import os
from collections.abc import Callable
from typing import Any

import tensorboardX

PROGRESS_FORMAT = (
    "[{wall_time_s:7.1f}s] env steps {env_steps:>9,d} | episodes {episodes:>6,d} | "
    "return {mean_return:8.2f} | eval {eval_return:8.2f} | "
    "{env_steps_per_s:>8,.0f} env steps/s | {learner_steps_per_s:>6,.1f} updates/s"
)


class MetricsLogger:
    """Writes one row per call to CSV and TensorBoard (x-axis: env steps).

    Args:
      logdir: where metrics.csv and the event files go.
      resume_env_steps: continue the curve of a resumed run, whose checkpoint
        was taken at this many env steps: rows past it (written between that
        checkpoint and a crash) are dropped from the CSV and hidden in
        TensorBoard; the rows before it stay. None starts a new curve.
      also: given each row too, after the CSV and TensorBoard (W&B's tracker).
    """

    def __init__(
        self,
        logdir: str,
        resume_env_steps: int | None = None,
        also: Callable[[dict[str, Any]], None] | None = None,
    ):
        os.makedirs(logdir, exist_ok=True)
        self._also = also
        self._csv_path = os.path.join(logdir, "metrics.csv")
        self._rows: list[dict[str, Any]] = []
        self._columns: list[str] = []
        purge_step = None
        if resume_env_steps is not None:
            self._rows, self._columns = read_csv(self._csv_path, resume_env_steps)
            self._rewrite_csv()
            purge_step = resume_env_steps + 1
        self._tensorboard = tensorboardX.SummaryWriter(logdir, purge_step=purge_step)

    @property
    def last_row(self) -> dict[str, Any] | None:
        """The newest row written (or kept from before a resume)."""
        return self._rows[-1] if self._rows else None

    def write(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        new_columns = [key for key in row if key not in self._columns]
        if new_columns:
            # A column appears late (losses start after replay fills): rewrite the file
            # so that every row has every column. Rows are few (one per log interval).
            self._columns += new_columns
            self._rewrite_csv()
        else:
            with open(self._csv_path, "a", newline="") as f:
                csv.DictWriter(f, self._columns).writerow(row)
        for key, value in row.items():
            if isinstance(value, (int, float)) and not math.isnan(value):
                self._tensorboard.add_scalar(key, value, global_step=row.get("env_steps", 0))
        self._tensorboard.flush()
        if self._also is not None:
            self._also(row)

    def _rewrite_csv(self) -> None:
        with open(self._csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, self._columns)
            writer.writeheader()
            writer.writerows(self._rows)

    def close(self) -> None:
        self._tensorboard.close()


def read_csv(path: str, max_env_steps: float) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows of a metrics.csv up to `max_env_steps`, numbers parsed, and its columns.

    A last line without its line end was cut by a crash while it was written: it is
    left out, with a warning (its last number may be cut short too).
    """
    if not os.path.exists(path):
        return [], []
    with open(path, newline="") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    if len(lines) > 1 and not lines[-1].endswith(("\n", "\r")):
        logging.warning(
            "%s: its last row was cut short (a crash while writing it?): left out", path
        )
        lines.pop()
    reader = csv.DictReader(lines)
    # An empty cell is a column that did not exist yet when the row was written.
    rows = [
        {k: _number(v) for k, v in row.items() if k is not None and v not in ("", None)}
        for row in reader
    ]
    columns = list(reader.fieldnames or [])
    return [row for row in rows if row.get("env_steps", 0) <= max_env_steps], columns


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def progress_line(row: dict[str, Any]) -> str:
    return PROGRESS_FORMAT.format(**row)
