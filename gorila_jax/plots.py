"""Pictures of runs: learning curves over seeds (IQM or mean under a 95 % band, from
`curves`) and a sweep's final-return distribution. See docs/plots.md.
"""

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from gorila_jax import curves

DPI = 100
PANEL_WIDTH_IN, PANEL_HEIGHT_IN = 5.0, 3.4


@dataclasses.dataclass(frozen=True)
class Panel:
    """One row of the figure: a y quantity and the series drawn for it.

    Attributes:
      ylabel: the y-axis label.
      series: (legend name, `curves.series` name) pairs, drawn solid, dashed, dotted...
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


def _logged(groups: dict[str, list[curves.Run]], panel: str, x_axis: str) -> bool:
    """Whether some run logged a series of `panel`; says so where none did."""
    present = any(
        curves.series(run, series, x_axis) is not None
        for runs in groups.values()
        for run in runs
        for _, series in PANELS[panel].series
    )
    if not present:
        print(f"plot: no run logged what panel {panel!r} shows; left out")
    return present


def draw_curves(
    groups: dict[str, list[curves.Run]],
    panels: Sequence[str] = ("return",),
    x_axes: Sequence[str] = tuple(curves.X_AXES),
    stat: str = "iqm",
):
    """The learning-curve figure: a row per panel, a column per x axis, a line per group
    and series with its 95 % band (see `curves.aggregate`).

    A panel that no run has the columns for is left out, with a printed note.

    Returns:
      The matplotlib Figure (not shown; `savefig` writes it).

    Raises:
      ValueError: an unknown panel, x axis or statistic, or nothing to draw.
    """
    unknown = [name for name in panels if name not in PANELS]
    if unknown:
        raise ValueError(f"unknown panel {', '.join(unknown)}; valid: {', '.join(PANELS)}")
    unknown = [name for name in x_axes if name not in curves.X_AXES]
    if unknown:
        raise ValueError(f"unknown x axis {', '.join(unknown)}; valid: {', '.join(curves.X_AXES)}")
    if stat not in curves.STATS:
        raise ValueError(f"unknown statistic {stat!r}; valid: {', '.join(curves.STATS)}")
    if not groups or not all(groups.values()):
        raise ValueError("nothing to draw: no runs")
    drawn = [name for name in panels if _logged(groups, name, x_axes[0])]
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
            ax.set_xlabel(curves.X_AXES[x_axis])
            ax.set_ylabel(PANELS[name].ylabel)
            ax.grid(alpha=0.3)
        axes[row][0].legend(fontsize="x-small")
    return fig


def _draw_panel(
    ax, groups: dict[str, list[curves.Run]], panel: Panel, x_axis: str, stat: str
) -> None:
    for color_index, (group, runs) in enumerate(groups.items()):
        color = f"C{color_index % 10}"
        for style, (legend_name, series_name) in zip(LINE_STYLES, panel.series):
            run_series = [
                s for run in runs if (s := curves.series(run, series_name, x_axis)) is not None
            ]
            if not run_series:
                continue
            curve = curves.aggregate(run_series, stat)
            if curve is None:
                print(f"plot: {group}: its runs' {series_name} share no {x_axis} range; left out")
                continue
            label = f"{group} {legend_name}".strip() + f" ({_band_text(curve, stat)})"
            # A lone point (one evaluation) is a marker: a line through it would not show.
            marker = "o" if curve.x.size == 1 else None
            ax.plot(curve.x, curve.center, style, color=color, label=label, marker=marker)
            if curve.band is not None:
                ax.fill_between(curve.x, *curve.band, color=color, alpha=0.2, linewidth=0)


def _band_text(curve: curves.Curve, stat: str) -> str:
    """What the line and its band are, for the legend."""
    if curve.band_kind is None:
        return "1 run"
    band = "95% bootstrap CI" if curve.band_kind == "bootstrap" else "runs' 2.5-97.5%"
    return f"{stat.upper() if stat == 'iqm' else stat} of {curve.num_runs} runs, {band}"


def plot_logdirs(
    logdirs: Sequence[str],
    out: str,
    x_axes: Sequence[str] = tuple(curves.X_AXES),
    panels: Sequence[str] = ("return",),
    stat: str = "iqm",
    labels: Sequence[str] = (),
    role: str | None = None,
):
    """Draws the runs under `logdirs` (see `curves.find_groups`) to `out`; groups of the same
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
    groups: dict[str, list[curves.Run]] = {}
    for logdir, label in zip(logdirs, labels or [None] * len(logdirs)):
        for group, run_logdirs in curves.find_groups(logdir, label).items():
            groups.setdefault(group, []).extend(curves.read_run(d, role) for d in run_logdirs)
    fig = draw_curves(groups, panels, x_axes, stat)
    fig.savefig(out)
    return fig


def write_run_curves(logdir: str, path: str | None = None) -> str:
    """Writes a run's curves.png: greedy and training return against env steps and
    against wall seconds; one line per role for a run of role groups.

    Returns:
      The path written (default `<logdir>/curves.png`).

    Raises:
      FileNotFoundError, ValueError: as `curves.read_run`, or when the run logged no return.
    """
    path = path or os.path.join(logdir, "curves.png")
    roles = curves.run_roles(logdir)
    if roles:
        groups = {role: [curves.read_run(logdir, role)] for role in roles}
    else:
        groups = {os.path.basename(os.path.normpath(logdir)): [curves.read_run(logdir)]}
    draw_curves(groups).savefig(path)
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
        bad = [r for r in returns if not curves.is_number(r)]
        if bad:
            raise ValueError(f"group {group!r} has final returns that are not numbers: {bad}")
    from matplotlib import figure as figure_lib  # see draw_curves

    names = list(final_returns)
    fig = figure_lib.Figure(
        figsize=(PANEL_WIDTH_IN * 1.4, 1.0 + 0.55 * len(names)), dpi=DPI, layout="constrained"
    )
    ax = fig.subplots()
    jitter = np.random.default_rng(curves.BOOTSTRAP_SEED)
    for position, name in enumerate(names):
        returns = np.asarray(final_returns[name], dtype=float)
        if not returns.size:
            continue
        ax.boxplot(returns, positions=[position], orientation="horizontal", widths=0.5)
        offsets = jitter.uniform(-0.15, 0.15, returns.size)
        ax.plot(returns, position + offsets, "o", color="C0", alpha=0.7, markersize=4)
        iqm = float(curves.statistic(returns[:, None], "iqm")[0])
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
