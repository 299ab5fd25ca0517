"""Pictures of runs: learning curves over seeds (IQM or mean under a 95 % band) and a
sweep's final-return distribution.

A run is a logdir with metrics.csv (written by `metrics.MetricsLogger`) and, once it
ended, summary.json (its greedy evaluations). A group is a set of runs drawn as one
line: the runs of one sweep group, or a single run. See docs/plots.md.
"""

import csv
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

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
DPI = 100
PANEL_WIDTH_IN, PANEL_HEIGHT_IN = 5.0, 3.4
DROPPED_COLUMNS = ("dropped_stale", "dropped_outlier", "dropped_nonfinite")


@dataclasses.dataclass(frozen=True)
class Panel:
    """One row of the figure: a y quantity and the series drawn for it.

    Attributes:
      ylabel: the y-axis label.
      series: (legend name, series name) pairs, drawn solid, dashed, dotted... in order.
    """

    ylabel: str
    series: tuple[tuple[str, str], ...]


PANELS = {
    "return": Panel("return", (("greedy", "eval_return"), ("training", "mean_return"))),
    "env_steps_per_s": Panel("env steps/s", (("", "env_steps_per_s"),)),
    "learner_steps_per_s": Panel("updates/s", (("", "learner_steps_per_s"),)),
    "replay_ratio": Panel("replay items sampled / env step", (("", "replay_ratio"),)),
    "gorila": Panel(
        "gradients (run total)",
        (("applied", "gradients_applied"), ("dropped", "gradients_dropped")),
    ),
}
LINE_STYLES = ("-", "--", ":", "-.")


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


def read_run(logdir: str) -> Run:
    """Reads a run's metrics.csv and, if the run ended, its summary.json.

    The greedy evaluations come from summary.json: the evaluator's, then the driver's
    final one (the sweep's result). A run still going, without summary.json, has the
    latest greedy return of each metrics.csv row instead.

    Raises:
      FileNotFoundError: `logdir` has no metrics.csv.
      ValueError: metrics.csv or summary.json cannot be read, naming the file.
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
            if not _is_number(row.get(needed)):
                raise ValueError(f"cannot read {csv_path}: line {line} has no number in {needed}")
    summary = _read_summary(logdir)
    if summary is None:
        evaluations = [
            {"env_steps": row["env_steps"], "wall_time_s": row["wall_time_s"], "eval_return": e}
            for row in rows
            if _is_number(e := row.get("eval_return"))
        ]
        return Run(logdir, rows, evaluations, None)
    batch_size = summary.get("agent_config", {}).get("batch_size")
    return Run(logdir, rows, _evaluations(rows, summary), batch_size)


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


def _evaluations(rows: list[dict[str, Any]], summary: dict[str, Any]) -> list[dict[str, float]]:
    """The summary's greedy evaluations, each placed on the run's wall clock.

    An evaluation records the env-step count it was taken at, not the run's clock: its
    wall time is where metrics.csv (and the summary's end) reached that many env steps.
    """
    points = [(row["env_steps"], row["wall_time_s"]) for row in rows]
    end = (summary.get("env_steps"), summary.get("wall_time_s"))
    if all(_is_number(value) for value in end):
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
        if _is_number(e.get("env_steps")) and _is_number(e.get("eval_return"))
    ]
    if _is_number(summary.get("final_eval_return")) and _is_number(end[0]):
        evaluations.append((end[0], summary["final_eval_return"]))
    return [
        {"env_steps": x, "wall_time_s": float(np.interp(x, clock_x, clock_y)), "eval_return": y}
        for x, y in evaluations
    ]


def _is_number(value: Any) -> bool:
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
            if all(_is_number(row.get(c)) for c in DROPPED_COLUMNS)
        ]
    else:
        points = [(row[x_axis], row[name]) for row in run.rows if _is_number(row.get(name))]
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
        if new_updates and not _is_number(batch_size):
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
    center = _statistic(values, stat)
    if num_runs >= MIN_RUNS_FOR_BOOTSTRAP:
        resampled_runs = np.random.default_rng(BOOTSTRAP_SEED).integers(
            0, num_runs, size=(BOOTSTRAP_RESAMPLES, num_runs)
        )
        resampled = _statistic(np.moveaxis(values[resampled_runs], 1, 0), stat)
        low, high = np.percentile(resampled, [2.5, 97.5], axis=0)
        return Curve(grid, center, (low, high), num_runs, "bootstrap")
    if num_runs == 2:
        low, high = np.percentile(values, [2.5, 97.5], axis=0)
        return Curve(grid, center, (low, high), num_runs, "percentile")
    return Curve(grid, center, None, num_runs, None)


def _statistic(values: np.ndarray, stat: str) -> np.ndarray:
    """The statistic over runs (axis 0): the mean, or the IQM, the mean of the middle
    50 % (rliable's: scipy.stats.trim_mean with 25 % cut from each end)."""
    if stat == "mean":
        return values.mean(axis=0)
    num_runs = values.shape[0]
    cut = int(0.25 * num_runs)
    return np.sort(values, axis=0)[cut : num_runs - cut].mean(axis=0)


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


def draw_curves(
    groups: dict[str, list[Run]],
    panels: Sequence[str] = ("return",),
    x_axes: Sequence[str] = tuple(X_AXES),
    stat: str = "iqm",
):
    """The learning-curve figure: a row per panel, a column per x axis, a line per group
    and series with its 95 % band (see `aggregate`).

    A panel that no run has the columns for is left out, with a printed note.

    Returns:
      The matplotlib Figure (not shown; `savefig` writes it).

    Raises:
      ValueError: an unknown panel, x axis or statistic, or nothing to draw.
    """
    unknown = [name for name in panels if name not in PANELS]
    if unknown:
        raise ValueError(f"unknown panel {', '.join(unknown)}; valid: {', '.join(PANELS)}")
    unknown = [name for name in x_axes if name not in X_AXES]
    if unknown:
        raise ValueError(f"unknown x axis {', '.join(unknown)}; valid: {', '.join(X_AXES)}")
    if stat not in STATS:
        raise ValueError(f"unknown statistic {stat!r}; valid: {', '.join(STATS)}")
    if not groups or not all(groups.values()):
        raise ValueError("nothing to draw: no runs")
    drawn = []
    for name in panels:
        present = any(
            series(run, s, x_axes[0]) is not None
            for runs in groups.values()
            for run in runs
            for _, s in PANELS[name].series
        )
        if present:
            drawn.append(name)
        else:
            print(f"plot: no run logged what panel {name!r} shows; left out")
    if not drawn:
        raise ValueError(f"nothing to draw: no run logged what panels {list(panels)} show")

    # Imported here: a run that never draws does not pay for matplotlib, and Figure
    # alone (no pyplot) needs no display and leaves no global state behind.
    from matplotlib import figure as figure_lib

    fig = figure_lib.Figure(
        figsize=(PANEL_WIDTH_IN * len(x_axes), PANEL_HEIGHT_IN * len(drawn)),
        dpi=DPI,
        layout="constrained",
    )
    axes = fig.subplots(len(drawn), len(x_axes), squeeze=False)
    for row, name in enumerate(drawn):
        for column, x_axis in enumerate(x_axes):
            ax = axes[row][column]
            _draw_panel(ax, groups, PANELS[name], x_axis, stat)
            ax.set_xlabel(X_AXES[x_axis])
            ax.set_ylabel(PANELS[name].ylabel)
            ax.grid(alpha=0.3)
        axes[row][0].legend(fontsize="x-small")
    return fig


def _draw_panel(ax, groups: dict[str, list[Run]], panel: Panel, x_axis: str, stat: str) -> None:
    for color_index, (group, runs) in enumerate(groups.items()):
        color = f"C{color_index % 10}"
        for style, (legend_name, series_name) in zip(LINE_STYLES, panel.series):
            run_series = [s for run in runs if (s := series(run, series_name, x_axis)) is not None]
            if not run_series:
                continue
            curve = aggregate(run_series, stat)
            if curve is None:
                print(f"plot: {group}: its runs' {series_name} share no {x_axis} range; left out")
                continue
            label = f"{group} {legend_name}".strip() + f" ({_band_text(curve, stat)})"
            # A lone point (one evaluation) is a marker: a line through it would not show.
            marker = "o" if curve.x.size == 1 else None
            ax.plot(curve.x, curve.center, style, color=color, label=label, marker=marker)
            if curve.band is not None:
                ax.fill_between(curve.x, *curve.band, color=color, alpha=0.2, linewidth=0)


def _band_text(curve: Curve, stat: str) -> str:
    """What the line and its band are, for the legend."""
    if curve.band_kind is None:
        return "1 run"
    band = "95% bootstrap CI" if curve.band_kind == "bootstrap" else "runs' 2.5-97.5%"
    return f"{stat.upper() if stat == 'iqm' else stat} of {curve.num_runs} runs, {band}"


def plot_logdirs(
    logdirs: Sequence[str],
    out: str,
    x_axes: Sequence[str] = tuple(X_AXES),
    panels: Sequence[str] = ("return",),
    stat: str = "iqm",
    labels: Sequence[str] = (),
):
    """Draws the runs under `logdirs` (see `find_groups`) to `out`; groups of the same
    name, from any logdir, are one group.

    Returns:
      The matplotlib Figure written.

    Raises:
      ValueError: labels that do not match the logdirs one to one, bad panels or
        statistic, unreadable files.
      FileNotFoundError: a logdir without any run, naming it.
    """
    if labels and len(labels) != len(logdirs):
        raise ValueError(f"{len(labels)} labels for {len(logdirs)} logdirs: give one per logdir")
    groups: dict[str, list[Run]] = {}
    for logdir, label in zip(logdirs, labels or [None] * len(logdirs)):
        for group, run_logdirs in find_groups(logdir, label).items():
            groups.setdefault(group, []).extend(read_run(d) for d in run_logdirs)
    fig = draw_curves(groups, panels, x_axes, stat)
    fig.savefig(out)
    return fig


def write_run_curves(logdir: str, path: str | None = None) -> str:
    """Writes a run's curves.png: greedy and training return against env steps and
    against wall seconds.

    Returns:
      The path written (default `<logdir>/curves.png`).

    Raises:
      FileNotFoundError, ValueError: as `read_run`, or when the run logged no return.
    """
    path = path or os.path.join(logdir, "curves.png")
    draw_curves({os.path.basename(os.path.normpath(logdir)): [read_run(logdir)]}).savefig(path)
    return path


def sweep_figure(final_returns: dict[str, list[float]], threshold: float | None = None):
    """The final greedy return of each run, a row per group: a box over its runs, each
    run as a dot, the group's IQM as a diamond, `threshold` as a dashed line.

    Returns:
      The matplotlib Figure.

    Raises:
      ValueError: no groups, or a return that is not a finite number.
    """
    if not final_returns:
        raise ValueError("no groups to draw")
    for group, returns in final_returns.items():
        bad = [r for r in returns if not _is_number(r)]
        if bad:
            raise ValueError(f"group {group!r} has final returns that are not numbers: {bad}")
    from matplotlib import figure as figure_lib  # see draw_curves

    names = list(final_returns)
    fig = figure_lib.Figure(
        figsize=(PANEL_WIDTH_IN * 1.4, 1.0 + 0.55 * len(names)), dpi=DPI, layout="constrained"
    )
    ax = fig.subplots()
    jitter = np.random.default_rng(BOOTSTRAP_SEED)
    for position, name in enumerate(names):
        returns = np.asarray(final_returns[name], dtype=float)
        if not returns.size:
            continue
        ax.boxplot(returns, positions=[position], orientation="horizontal", widths=0.5)
        offsets = jitter.uniform(-0.15, 0.15, returns.size)
        ax.plot(returns, position + offsets, "o", color="C0", alpha=0.7, markersize=4)
        iqm = float(_statistic(returns[:, None], "iqm")[0])
        ax.plot([iqm], [position], "D", color="C3", markersize=7)
    ax.plot([], [], "D", color="C3", label="IQM")
    ax.plot([], [], "o", color="C0", label="one run")
    if threshold is not None:
        ax.axvline(threshold, color="0.4", linestyle="--", label=f"threshold {threshold:g}")
    ax.set_yticks(range(len(names)), [f"{n} (n={len(final_returns[n])})" for n in names])
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel("final greedy return")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize="x-small")
    return fig


def write_sweep_figure(
    final_returns: dict[str, list[float]], path: str, threshold: float | None = None
) -> None:
    """Writes sweep.png (`sweep_figure`): group name -> each run's final greedy return."""
    sweep_figure(final_returns, threshold).savefig(path)
