"""Draws learning curves of runs and sweeps: one line per group with a 95 % band over seeds.

Examples:
  python -m launch.plot --logdir=runs/latest --out=curves.png
  python -m launch.plot --logdir=runs/sweep1 --logdir=runs/baseline --label=new --label=old
  python -m launch.plot --logdir=runs/sweep1 --x=wall_time_s --stat=mean
  python -m launch.plot --logdir=runs/gorila --panels=return,env_steps_per_s,replay_ratio,gorila

A --logdir is a run (it has metrics.csv: one group) or a sweep folder (its sweep.json
groups, or each folder with metrics.csv grouped by its parent folder). Groups of the
same name are one group, whichever --logdir they come from. See docs/plots.md.
"""

import sys

from absl import app, flags

from gorila_jax import curves, plots

_LOGDIRS = flags.DEFINE_multi_string(
    "logdir", None, "A run's logdir or a sweep folder; repeat for more.", required=True
)
_OUT = flags.DEFINE_string("out", "curves.png", "The image to write (.png, .pdf, .svg).")
_X = flags.DEFINE_enum(
    "x", "both", [*curves.X_AXES, "both"], "The x axis: env steps, wall-clock seconds or both."
)
_PANELS = flags.DEFINE_list(
    "panels", ["return"], f"Rows of the figure, from: {', '.join(plots.PANELS)}."
)
_STAT = flags.DEFINE_enum(
    "stat", "iqm", list(curves.STATS), "The line over seeds: interquartile mean or mean."
)
_ROLE = flags.DEFINE_string(
    "role",
    None,
    "For runs of a task of several roles (mpe/simple_tag_v3): draw this role's returns.",
)
_LABELS = flags.DEFINE_multi_string(
    "label",
    [],
    "A name per --logdir, in order: a run's group name, or a prefix to a sweep's groups.",
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}")
    x_axes = tuple(curves.X_AXES) if _X.value == "both" else (_X.value,)
    try:
        plots.plot_logdirs(
            _LOGDIRS.value,
            _OUT.value,
            x_axes,
            _PANELS.value,
            _STAT.value,
            _LABELS.value,
            _ROLE.value,
        )
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
