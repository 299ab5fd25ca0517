"""Learning curves of runs, read from their logdirs and aggregated over seeds.

A run is a logdir with metrics.csv (written by `metrics.MetricsLogger`) and, once it
ended, summary.json (its greedy evaluations). A group is a set of runs aggregated
into one curve: the runs of one sweep group, or a single run. `plots` draws them;
see docs/plots.md.
"""

import csv
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from gorila_jax import metrics

# x-axis name -> its label. Both are metrics.csv columns.
X_AXES = {"env_steps": "env steps", "wall_time_s": "wall-clock seconds"}
STATS = ("iqm", "mean")
# Points of the common x grid that a group's runs are interpolated onto.
GRID_POINTS = 200
# Percentile bootstrap over runs: resamples, and a fixed seed so a figure redraws the same.
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
# Below this many runs a bootstrap of the IQM says nothing: the band is then the runs'
# own 2.5-97.5 percentiles.
MIN_RUNS_FOR_BOOTSTRAP = 3
DROPPED_COLUMNS = ("dropped_stale", "dropped_outlier", "dropped_nonfinite")


@dataclasses.dataclass(frozen=True)
class Run:
    """What one run logged.

    Attributes:
      logdir: the run's logdir.
      rows: metrics.csv, one dict per log interval, numbers parsed.
      evaluations: greedy evaluations in order, each with env_steps, wall_time_s and
        eval_return.
      batch_size: the agent config's batch_size (summary.json), None if unknown; the
        replay ratio's fallback when metrics.csv has no batch_size column (Gorila mode).
    """

    logdir: str
    rows: list[dict[str, Any]]
    evaluations: list[dict[str, float]]
    batch_size: int | None


# What a run of role groups logs per role (`<role>/<figure>`) that stands for the
# run's own figure when one role's view is asked for.
ROLE_FIGURES = ("mean_return", "eval_return", "learner_steps")


def role_summary(summary: dict[str, Any], role: str, source: str = "summary.json") -> dict:
    """A summary of a run of role groups as `role`'s alone: its final greedy return and
    its evaluations in place of the run's.

    Raises:
      ValueError: the run has no such role (naming its roles, or saying it has none).
    """
    roles = summary.get("roles") or {}
    if role not in roles:
        has = f"its roles are {', '.join(roles)}" if roles else "it is not a run of role groups"
        raise ValueError(f"{source} has no role {role!r}: {has}")
    return {
        **summary,
        "final_eval_return": roles[role].get("final_eval_return"),
        "evaluations": [e for e in summary.get("evaluations", []) if e.get("role") == role],
    }


def run_roles(logdir: str) -> tuple[str, ...]:
    """The roles of a finished run of role groups in `logdir`; () for any other run."""
    summary = _read_summary(logdir) or {}
    return tuple(summary.get("roles") or ())


def role_rows(rows: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    """metrics.csv rows with `role`'s figures (`ROLE_FIGURES`) under the run's names."""
    return [{**row, **{name: row.get(f"{role}/{name}") for name in ROLE_FIGURES}} for row in rows]


def read_run(logdir: str, role: str | None = None) -> Run:
    """Reads a run's metrics.csv and, if the run ended, its summary.json.

    The greedy evaluations come from summary.json: the evaluator's, then the driver's
    final one (the sweep's result). A run still going, without summary.json, has the
    latest greedy return of each metrics.csv row instead. With `role`, the run (one of
    role groups) as that role's: its returns, evaluations and learner steps.

    Raises:
      FileNotFoundError: `logdir` has no metrics.csv.
      ValueError: metrics.csv or summary.json cannot be read, naming the file; no such role.
    """
    csv_path = os.path.join(logdir, "metrics.csv")
    if not os.path.isfile(csv_path):
        raise FileNotFoundError(f"{logdir} is not a run's logdir: it has no metrics.csv")
    try:
        rows, columns = metrics.read_csv(csv_path, math.inf)
    except (csv.Error, UnicodeDecodeError, TypeError) as error:
        raise ValueError(f"cannot read {csv_path}: {error}") from None
    for needed in X_AXES:
        if needed not in columns:
            raise ValueError(f"cannot read {csv_path}: it has no {needed} column")
    for line, row in enumerate(rows, start=2):
        for needed in X_AXES:
            if not is_number(row.get(needed)):
                raise ValueError(f"cannot read {csv_path}: line {line} has no number in {needed}")
    summary = _read_summary(logdir)
    if role is not None:
        rows = role_rows(rows, role)
        if f"{role}/eval_return" not in columns:
            raise ValueError(f"{csv_path} has no role {role!r}: no {role}/eval_return column")
        if summary is not None:
            summary = role_summary(summary, role, os.path.join(logdir, "summary.json"))
    if summary is None:
        evaluations = [
            {"env_steps": row["env_steps"], "wall_time_s": row["wall_time_s"], "eval_return": e}
            for row in rows
            if is_number(e := row.get("eval_return"))
        ]
        return Run(logdir, rows, evaluations, None)
    batch_size = summary.get("agent_config", {}).get("batch_size")
    return Run(logdir, rows, evaluations_on_clock(rows, summary), batch_size)


def _read_summary(logdir: str) -> dict[str, Any] | None:
    path = os.path.join(logdir, "summary.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            summary = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from None
    if not isinstance(summary, dict):
        raise ValueError(f"cannot read {path}: not a JSON object")
    return summary


def evaluations_on_clock(
    rows: list[dict[str, Any]], summary: dict[str, Any]
) -> list[dict[str, float]]:
    """The summary's greedy evaluations, the driver's final one last, each placed on the
    run's wall clock.

    An evaluation records the env-step count it was taken at, not the run's clock: its
    wall time is where metrics.csv (and the summary's end) first reached that many env
    steps. So a finished run resumed again (a sweep re-run after its summary.json was
    lost) keeps its evaluations' times: its rows and first arrival at the end stay.
    """
    points = [(row["env_steps"], row["wall_time_s"]) for row in rows]
    end = (summary.get("env_steps"), summary.get("wall_time_s"))
    if all(is_number(value) for value in end):
        points.append(end)
    # The first time each env-step count was reached: counters stand still while
    # nodes start, and np.interp needs increasing x.
    first_reached: dict[float, float] = {}
    for env_steps, wall_time_s in sorted(points):
        first_reached.setdefault(env_steps, wall_time_s)
    if not first_reached:
        return []
    clock_x, clock_y = np.array(list(first_reached.items())).T
    evaluations = [
        (e["env_steps"], e["eval_return"])
        for e in summary.get("evaluations", [])
        if is_number(e.get("env_steps")) and is_number(e.get("eval_return"))
    ]
    if is_number(summary.get("final_eval_return")) and is_number(end[0]):
        evaluations.append((end[0], summary["final_eval_return"]))
    return [
        {"env_steps": x, "wall_time_s": float(np.interp(x, clock_x, clock_y)), "eval_return": y}
        for x, y in evaluations
    ]


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def series(run: Run, name: str, x_axis: str) -> tuple[np.ndarray, np.ndarray] | None:
    """One quantity of a run against `x_axis`, x increasing; None if the run lacks it.

    Names: eval_return (greedy), replay_ratio (replay items sampled per env step, over
    the whole run), gradients_dropped (stale + outlier + non-finite), or any
    metrics.csv column (mean_return is the training return).
    """
    if name == "eval_return":
        points = [(e[x_axis], e["eval_return"]) for e in run.evaluations]
    elif name == "replay_ratio":
        points = _replay_ratio(run, x_axis)
    elif name == "gradients_dropped":
        points = [
            (row[x_axis], sum(row[c] for c in DROPPED_COLUMNS))
            for row in run.rows
            if all(is_number(row.get(c)) for c in DROPPED_COLUMNS)
        ]
    else:
        points = [(row[x_axis], row[name]) for row in run.rows if is_number(row.get(name))]
    if not points:
        return None
    x, y = np.array(points, dtype=float).T
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    # Of points at one x (two evaluations at the end of a run) the later one stands.
    last_at_x = np.append(x[1:] != x[:-1], True)
    return x[last_at_x], y[last_at_x]


def _replay_ratio(run: Run, x_axis: str) -> list[tuple[float, float]]:
    """Items sampled so far / env steps so far, at each row.

    Each interval's updates are counted at that row's batch size (a growing batch), or
    the config's where metrics.csv has no batch_size column (Gorila workers).
    """
    points, sampled, previous_updates = [], 0.0, 0
    for row in run.rows:
        new_updates = row.get("learner_steps", previous_updates) - previous_updates
        batch_size = row.get("batch_size", run.batch_size)
        if new_updates and not is_number(batch_size):
            return []
        sampled += new_updates * (batch_size or 0)
        previous_updates += new_updates
        if row["env_steps"] > 0:
            points.append((row[x_axis], sampled / row["env_steps"]))
    return points


@dataclasses.dataclass(frozen=True)
class Curve:
    """A group's aggregate of one series on a common x grid.

    Attributes:
      x: the grid, from the latest first point to the earliest last point of the runs.
      center: the statistic over runs at each x.
      band: (low, high) at each x, None for a single run.
      num_runs: how many runs the curve aggregates.
      band_kind: "bootstrap" (95 % percentile-bootstrap CI of the statistic),
        "percentile" (the runs' own 2.5-97.5 percentiles) or None.
    """

    x: np.ndarray
    center: np.ndarray
    band: tuple[np.ndarray, np.ndarray] | None
    num_runs: int
    band_kind: str | None


def aggregate(run_series: Sequence[tuple[np.ndarray, np.ndarray]], stat: str) -> Curve | None:
    """The IQM or mean over runs of one series, and its 95 % band.

    Each run is linearly interpolated onto a grid that spans only the x range every run
    covers: no run is extrapolated past its first or last point, and every x holds the
    same runs.

    Returns:
      The curve; None if the runs share no x range.

    Raises:
      ValueError: an unknown `stat`, or no runs.
    """
    if stat not in STATS:
        raise ValueError(f"unknown statistic {stat!r}; valid: {', '.join(STATS)}")
    if not run_series:
        raise ValueError("no runs to aggregate")
    start = max(x[0] for x, _ in run_series)
    end = min(x[-1] for x, _ in run_series)
    if start > end:
        return None
    grid = np.linspace(start, end, GRID_POINTS if end > start else 1)
    values = np.stack([np.interp(grid, x, y) for x, y in run_series])  # [runs, points]
    num_runs = len(run_series)
    center = statistic(values, stat)
    if num_runs >= MIN_RUNS_FOR_BOOTSTRAP:
        resampled_runs = np.random.default_rng(BOOTSTRAP_SEED).integers(
            0, num_runs, size=(BOOTSTRAP_RESAMPLES, num_runs)
        )
        resampled = statistic(np.moveaxis(values[resampled_runs], 1, 0), stat)
        low, high = np.percentile(resampled, [2.5, 97.5], axis=0)
        return Curve(grid, center, (low, high), num_runs, "bootstrap")
    if num_runs == 2:
        low, high = np.percentile(values, [2.5, 97.5], axis=0)
        return Curve(grid, center, (low, high), num_runs, "percentile")
    return Curve(grid, center, None, num_runs, None)


def statistic(values: np.ndarray, stat: str) -> np.ndarray:
    """The statistic over runs (axis 0): the mean, or the IQM, the mean of the middle
    50 % (rliable's `aggregate_iqm`: 25 % cut from each end)."""
    if stat == "mean":
        return values.mean(axis=0)
    return stats.trim_mean(values, proportiontocut=0.25, axis=0)


def find_groups(logdir: str, label: str | None = None) -> dict[str, list[str]]:
    """Group name -> the run logdirs of each group under `logdir`.

    A logdir with metrics.csv is one run, its own group (named `label`, else the
    logdir). Otherwise it is a sweep: sweep.json's runs by their "group", or without
    sweep.json every folder under it with metrics.csv, grouped by its parent folder.
    A `label` names a single run, or prefixes a sweep's group names.

    Raises:
      FileNotFoundError: `logdir` does not exist or holds no run.
      ValueError: sweep.json cannot be read.
    """
    if not os.path.isdir(logdir):
        raise FileNotFoundError(f"{logdir}: no such directory")
    if os.path.isfile(os.path.join(logdir, "metrics.csv")):
        return {label or logdir: [logdir]}
    sweep_file = os.path.join(logdir, "sweep.json")
    if os.path.isfile(sweep_file):
        runs = _sweep_runs(logdir, sweep_file)
    else:
        runs = _runs_below(logdir)
    if not runs:
        raise FileNotFoundError(
            f"{logdir} holds no run: no metrics.csv in it or in any folder under it"
        )
    groups: dict[str, list[str]] = {}
    for group, run_logdir in runs:
        name = f"{label}/{group}" if label and group else (label or group or logdir)
        groups.setdefault(name, []).append(run_logdir)
    return groups


def _runs_below(logdir: str) -> list[tuple[str, str]]:
    """(parent folder relative to `logdir`, run logdir) of each run under it; "" for runs
    directly in it."""
    runs = []
    for folder, subfolders, files in os.walk(logdir):
        subfolders.sort()
        if "metrics.csv" in files and folder != logdir:
            subfolders.clear()  # a run's own folders (checkpoints) hold no runs
            parent = os.path.relpath(os.path.dirname(folder), logdir)
            runs.append(("" if parent == "." else parent, folder))
    return runs


def _sweep_runs(logdir: str, sweep_file: str) -> list[tuple[str, str]]:
    """(group, run logdir) of each run listed in sweep.json that has written metrics.

    A relative run logdir is taken from the sweep folder, else from the current folder.
    """
    try:
        with open(sweep_file) as f:
            listed = json.load(f)["runs"]
        runs = [(str(run["group"]), str(run["logdir"])) for run in listed]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
        raise ValueError(
            f"cannot read {sweep_file}: expected {{'runs': [{{'logdir': ..., 'group': ...}}]}} "
            f"({type(error).__name__}: {error})"
        ) from None
    found = []
    for group, run_logdir in runs:
        in_sweep = os.path.join(logdir, run_logdir)
        run_logdir = in_sweep if os.path.isdir(in_sweep) else run_logdir
        if os.path.isfile(os.path.join(run_logdir, "metrics.csv")):
            found.append((group, run_logdir))
    if len(found) < len(runs):
        print(f"{sweep_file}: {len(runs) - len(found)} of {len(runs)} runs have no metrics yet")
    return found
