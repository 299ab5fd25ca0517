"""Where a run's numbers go: metrics.csv, TensorBoard event files, a console progress line."""

import csv
import math
import os
from typing import Any

import tensorboardX

PROGRESS_FORMAT = (
    "[{wall_time_s:7.1f}s] env steps {env_steps:>9,d} | episodes {episodes:>6,d} | "
    "return {mean_return:8.2f} | eval {eval_return:8.2f} | "
    "{env_steps_per_s:>8,.0f} env steps/s | {learner_steps_per_s:>6,.1f} updates/s"
)


class MetricsLogger:
    """Writes one row per call to CSV and TensorBoard (x-axis: env steps)."""

    def __init__(self, logdir: str):
        os.makedirs(logdir, exist_ok=True)
        self._csv_path = os.path.join(logdir, "metrics.csv")
        self._rows: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._tensorboard = tensorboardX.SummaryWriter(logdir)

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

    def _rewrite_csv(self) -> None:
        with open(self._csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, self._columns)
            writer.writeheader()
            writer.writerows(self._rows)

    def close(self) -> None:
        self._tensorboard.close()


def progress_line(row: dict[str, Any]) -> str:
    return PROGRESS_FORMAT.format(**row)
