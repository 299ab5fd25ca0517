"""Runs seeds x a grid of overrides of `python -m launch.train` and reports statistics.

Examples:
  python -m launch.sweep --sweep_dir=runs/sweep1 --seeds=5 \
      --grid=config.learning_rate=1e-3,5e-4 --grid=num_actors=2,4 --threshold=475 \
      -- --agent=dqn --env=CartPole-v1
  python -m launch.sweep --sweep_dir=runs/sweep1 --launcher=ray ...  # runs side by side

Everything after `--` goes to every run; a grid key is a launch.train flag
(`config.x` is `--config.x`). A group is one grid point, a run is a group and a
seed (`--seed`), with its logdir at `<sweep_dir>/<group>/seed=<seed>`. Running
the same command again skips finished runs and resumes unfinished ones from
their checkpoints. See docs/sweeps.md.
"""

import argparse
import concurrent.futures
import contextlib
import csv
import dataclasses
import io
import itertools
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from gorila_jax import plots
from launch import stats

# Flags the sweep sets for every run itself.
SWEEP_OWNED_FLAGS = ("seed", "logdir", "resume", "launcher", "ray_address")
CONSOLE_LOG = "console.log"
TAIL_LINES = 15
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SweepError(ValueError):
    """A sweep that cannot start as asked; the message names the culprit."""


@dataclasses.dataclass
class Run:
    """One training run of the sweep and, once it ended, what it left."""

    group: str
    seed: int
    logdir: str
    flags: list[str]
    status: str = "pending"
    returncode: int | None = None
    final_return: float | None = None
    wall_time_s: float | None = None
    env_steps: int | None = None
    threshold: dict[str, Any] | None = None
    process_start_unix: float | None = None
    process_wall_s: float | None = None
    console_tail: list[str] = dataclasses.field(default_factory=list)


def parse_grid(specs: Sequence[str]) -> list[tuple[str, list[str]]]:
    """`key=v1,v2` specs as (key, values), in the order given.

    Raises:
      SweepError: for a malformed spec, a repeated key, or a flag the sweep sets itself.
    """
    grid, seen = [], set()
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip().removeprefix("--")
        items = [value.strip() for value in values.split(",")]
        if not sep or not key or not all(items):
            raise SweepError(f"--grid={spec!r}: expected KEY=VALUE[,VALUE...], e.g. num_actors=2,4")
        if key in SWEEP_OWNED_FLAGS:
            raise SweepError(f"--grid={spec!r}: the sweep sets --{key} itself")
        if key in seen:
            raise SweepError(f"--grid key {key!r} given twice")
        if len(set(items)) != len(items):
            raise SweepError(f"--grid={spec!r} repeats a value")
        seen.add(key)
        grid.append((key, items))
    return grid


def _group_name(point: Sequence[tuple[str, str]]) -> str:
    if not point:
        return "base"
    return ",".join(f"{key.removeprefix('config.')}={value}" for key, value in point).replace(
        os.sep, "_"
    )


def groups(grid: Sequence[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Every grid point as (group name, its launch.train flags)."""
    keys = [key for key, _ in grid]
    points = itertools.product(*(values for _, values in grid))
    return [
        (_group_name(list(zip(keys, point))), [f"--{k}={v}" for k, v in zip(keys, point)])
        for point in points
    ]


def _check_train_flags(train_flags: Sequence[str]) -> None:
    for flag in train_flags:
        name = flag.removeprefix("--").split("=")[0].removeprefix("no")
        if flag.startswith("-") and name in SWEEP_OWNED_FLAGS:
            raise SweepError(f"{flag}: the sweep sets --{name} for each run itself")


def declared_cpus(flags: Sequence[str]) -> float:
    """Parses and checks `flags` exactly as `python -m launch.train` does, without running.

    Returns:
      The CPUs the run's program declares (the sum over its nodes), what
      one run takes of a Ray cluster.

    Raises:
      SweepError: with launch.train's own error line (naming the flag or field).
    """
    from absl import flags as absl_flags

    from gorila_jax import envs
    from gorila_jax.run import experiment
    from launch import presets, train

    registry = absl_flags.FLAGS
    argv = ["launch.train", *flags]
    # The config flag is defined for one agent's config class and registers
    # one flag per override it finds in sys.argv: both change per run.
    for name in [name for name in registry if name == "config" or name.startswith("config.")]:
        delattr(registry, name)
    registry.unparse_flags()
    stderr, saved_argv = io.StringIO(), sys.argv
    try:
        sys.argv = argv
        with contextlib.redirect_stderr(stderr):
            train._define_config_flag(argv)
            rest = train._parse_flags(argv)
        if len(rest) > 1:
            raise SweepError(f"unexpected arguments {rest[1:]} in {' '.join(flags)}")
        config, exp_config = train.make_configs()
        builder = presets.AGENTS[train._AGENT.value].builder(config)
        train.check_configs(builder, exp_config)
        program = experiment.make_program(builder, exp_config, envs.env_spec(exp_config.env_id))
    except SystemExit as error:
        message = stderr.getvalue().strip() or str(error.code)
        raise SweepError(f"{message.removeprefix('error: ')} (in {' '.join(flags)})") from None
    except ValueError as error:
        raise SweepError(f"{error} (in {' '.join(flags)})") from None
    finally:
        sys.argv = saved_argv
    return sum(program.resources(node.group).num_cpus for node in program.nodes)


def finished_summary(logdir: str) -> dict[str, Any] | None:
    """The summary of a run that ended (not interrupted) in `logdir`, or None."""
    path = os.path.join(logdir, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    return summary if summary.get("stop_reason") != "interrupted" else None


def _read_result(run: Run, summary: dict[str, Any], threshold: float | None) -> None:
    run.final_return = summary["final_eval_return"]
    run.wall_time_s = summary.get("wall_time_s")
    run.env_steps = summary.get("env_steps")
    if threshold is not None:
        run.threshold = stats.first_crossing(run.logdir, summary, threshold)


def _tail(path: str) -> list[str]:
    with open(path, errors="replace") as f:
        return [line.rstrip("\n") for line in f.readlines()[-TAIL_LINES:]]


def execute(run: Run, launcher: str, ray_address: str | None, threshold: float | None) -> Run:
    """Runs `run` as a `python -m launch.train` process, resuming it if it has a checkpoint."""
    from gorila_jax.learning import checkpoint

    command = [sys.executable, "-m", "launch.train", *run.flags, f"--seed={run.seed}"]
    command += [f"--logdir={run.logdir}", f"--launcher={launcher}"]
    if ray_address:
        command.append(f"--ray_address={ray_address}")
    if checkpoint.saved_steps(run.logdir):
        command.append("--resume")
    os.makedirs(run.logdir, exist_ok=True)
    console = os.path.join(run.logdir, CONSOLE_LOG)
    run.process_start_unix = time.time()
    with open(console, "a") as log:
        log.write(f"# launch.sweep {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(command)}\n")
        log.flush()
        # Ctrl-C reaches the run too (same process group): it checkpoints and exits 130.
        run.returncode = subprocess.call(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    run.process_wall_s = time.time() - run.process_start_unix
    summary = finished_summary(run.logdir)
    if run.returncode == 0 and summary is not None:
        run.status = "finished"
        _read_result(run, summary, threshold)
    else:
        run.status = "interrupted" if run.returncode in (130, -2) else "failed"
        run.console_tail = _tail(console)
    return run


def _ray_cluster(address: str | None, num_cpus: int | None) -> tuple[str, float, bool]:
    """The address and CPU count of the cluster the runs join: `address`'s, or a new one."""
    import ray

    if address:
        ray.init(address=address)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)
    cpus = ray.cluster_resources().get("CPU", 0.0)
    return ray.get_runtime_context().gcs_address, cpus, address is None


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def _estimate_cells(estimates: dict[str, Any] | None, digits: int) -> list[str]:
    if estimates is None:
        return ["-"] * 3
    return [
        f"{_fmt(e['estimate'], digits)} [{_fmt(e['ci_low'], digits)}, {_fmt(e['ci_high'], digits)}]"
        for e in (estimates[name] for name in stats.AGGREGATES)
    ]


def group_table(group: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """A group's statistics as a header and rows: one row per quantity."""
    header = ["", *(f"{aggregate} [95% CI]" for aggregate in stats.AGGREGATES)]
    rows = [["final greedy return", *_estimate_cells(group["final_return"], 1)]]
    if "threshold" in group:
        rows.append(
            [f"env steps to {group['threshold']:g} (reached runs)"]
            + _estimate_cells(group["env_steps_to_threshold_over_reached"], 0)
        )
        rows.append(
            [f"wall s to {group['threshold']:g} (reached runs)"]
            + _estimate_cells(group["wall_time_s_to_threshold_over_reached"], 1)
        )
    return header, rows


def _group_title(name: str, group: dict[str, Any]) -> str:
    title = f"{name}: {group['num_finished']}/{group['num_runs']} runs finished"
    if "threshold" in group:
        fraction = group["fraction_at_threshold"]
        title += (
            f", final return >= {group['threshold']:g} in "
            f"{'-' if fraction is None else f'{fraction:.0%}'} of them, "
            f"{group['num_reached']} reached it during training"
        )
    return title


def print_tables(group_stats: dict[str, dict[str, Any]], out=sys.stdout) -> None:
    """One table per group: a rich table on a terminal, plain columns otherwise."""
    for name, group in group_stats.items():
        header, rows = group_table(group)
        if out.isatty():
            import rich.console
            import rich.table

            table = rich.table.Table(*header, title=_group_title(name, group))
            for row in rows:
                table.add_row(*row)
            rich.console.Console(file=out).print(table)
            continue
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        print(_group_title(name, group), file=out)
        for row in [header, *rows]:
            print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)), file=out)


def _csv_row(run: Run, grid_point: dict[str, str]) -> dict[str, Any]:
    crossing = run.threshold or {}
    return {
        "group": run.group,
        **grid_point,
        "seed": run.seed,
        "status": run.status,
        "returncode": run.returncode,
        "final_return": run.final_return,
        "wall_time_s": run.wall_time_s,
        "env_steps": run.env_steps,
        "reached_threshold": crossing.get("reached"),
        "env_steps_to_threshold": crossing.get("env_steps"),
        "wall_time_s_to_threshold": crossing.get("wall_time_s"),
        "logdir": run.logdir,
    }


def _write_figure(sweep_dir: str, runs: Sequence[Run], threshold: float | None) -> None:
    """sweep.png: each group's final greedy returns (the groups with any)."""
    finals: dict[str, list[float]] = {}
    for run in runs:
        if run.final_return is not None:
            finals.setdefault(run.group, []).append(run.final_return)
    if finals:
        plots.write_sweep_figure(finals, os.path.join(sweep_dir, "sweep.png"), threshold)


def write_results(
    sweep_dir: str,
    record: dict[str, Any],
    runs: Sequence[Run],
    grid_points: dict[str, dict[str, str]],
) -> None:
    """sweep.json (the command, every run, the statistics) and sweep.csv (a row per run)."""
    record = {**record, "runs": [dataclasses.asdict(run) for run in runs]}
    with open(os.path.join(sweep_dir, "sweep.json"), "w") as f:
        json.dump(record, f, indent=2)
    rows = [_csv_row(run, grid_points[run.group]) for run in runs]
    with open(os.path.join(sweep_dir, "sweep.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m launch.sweep",
        description="Seeds x a grid of launch.train runs, with rliable statistics per group.",
        epilog="Flags after -- go to every `python -m launch.train` run.",
    )
    parser.add_argument("--sweep_dir", required=True, help="One logdir per run goes under it.")
    parser.add_argument("--seeds", type=int, default=3, help="Seeds 0..N-1 per group.")
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        help="KEY=V1,V2: a launch.train flag (config.x for --config.x) and its values; repeat "
        "for a product.",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="Return a run counts as solved at: fraction of runs and time to it.",
    )
    parser.add_argument("--launcher", choices=["local", "ray"], default="local")
    parser.add_argument(
        "--max_concurrent",
        type=int,
        default=0,
        help="ray: at most this many runs at once (0: as many as the cluster's CPUs allow).",
    )
    parser.add_argument(
        "--ray_address", default=None, help="ray: join this cluster (default: start one)."
    )
    parser.add_argument(
        "--ray_num_cpus", type=int, default=None, help="ray: CPUs of the cluster it starts."
    )
    parser.add_argument("--bootstrap_reps", type=int, default=stats.DEFAULT_BOOTSTRAP_REPS)
    parser.add_argument("--bootstrap_seed", type=int, default=stats.DEFAULT_BOOTSTRAP_SEED)
    return parser


def _split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        index = list(argv).index("--")
        return list(argv[:index]), list(argv[index + 1 :])
    return list(argv), []


def plan(args: argparse.Namespace, train_flags: list[str]) -> tuple[list[Run], dict, float]:
    """The sweep's runs, each group's grid point, and the most CPUs one run declares.

    Raises:
      SweepError: before anything runs, for a bad grid, seed count or run flag.
    """
    if args.seeds < 1:
        raise SweepError(f"--seeds must be at least 1, got {args.seeds}")
    if args.max_concurrent < 0:
        raise SweepError(f"--max_concurrent must be non-negative, got {args.max_concurrent}")
    if args.bootstrap_reps < 1:
        raise SweepError(f"--bootstrap_reps must be at least 1, got {args.bootstrap_reps}")
    _check_train_flags(train_flags)
    grid = parse_grid(args.grid)
    runs, points, cpus = [], {}, 0.0
    for name, flags in groups(grid):
        cpus = max(cpus, declared_cpus([*train_flags, *flags]))
        points[name] = dict(zip([key for key, _ in grid], [f.split("=", 1)[1] for f in flags]))
        for seed in range(args.seeds):
            logdir = os.path.join(args.sweep_dir, name, f"seed={seed}")
            runs.append(Run(name, seed, logdir, [*train_flags, *flags]))
    return runs, points, cpus


def _report_end(run: Run, out=sys.stdout) -> None:
    if run.status == "finished":
        print(
            f"[{run.group} seed={run.seed}] finished: final greedy return "
            f"{_fmt(run.final_return)} in {_fmt(run.wall_time_s)}s",
            file=out,
            flush=True,
        )
        return
    print(
        f"[{run.group} seed={run.seed}] {run.status} with exit code {run.returncode}; "
        f"last lines of {os.path.join(run.logdir, CONSOLE_LOG)}:",
        file=out,
        flush=True,
    )
    for line in run.console_tail:
        print(f"    {line}", file=out, flush=True)


def sweep(args: argparse.Namespace, train_flags: list[str], command: list[str]) -> int:
    """Runs the sweep; the exit code is 0 only if every run finished."""
    start = time.monotonic()
    runs, points, run_cpus = plan(args, train_flags)
    os.makedirs(args.sweep_dir, exist_ok=True)
    pending = []
    for run in runs:
        summary = finished_summary(run.logdir)
        if summary is None:
            pending.append(run)
            continue
        run.status = "skipped"
        _read_result(run, summary, args.threshold)
        print(f"[{run.group} seed={run.seed}] skipped: finished before", flush=True)
    print(
        f"sweep: {len(runs)} runs ({len(points)} groups x {args.seeds} seeds), "
        f"{len(runs) - len(pending)} finished before, {len(pending)} to run in {args.sweep_dir}",
        flush=True,
    )
    concurrency, address, owns_cluster = 1, None, False
    if args.launcher == "ray" and pending:
        address, cluster_cpus, owns_cluster = _ray_cluster(args.ray_address, args.ray_num_cpus)
        if run_cpus > cluster_cpus:
            raise SweepError(
                f"a run declares {run_cpus:g} CPUs but the Ray cluster has {cluster_cpus:g}"
            )
        concurrency = max(1, int(cluster_cpus // run_cpus)) if run_cpus else len(pending)
        if args.max_concurrent:
            concurrency = min(concurrency, args.max_concurrent)
        print(
            f"sweep: Ray cluster {address} with {cluster_cpus:g} CPUs; each run declares "
            f"{run_cpus:g}: {concurrency} at a time",
            flush=True,
        )
    interrupted = False
    try:
        interrupted = _run_all(pending, concurrency, args, address)
    finally:
        if owns_cluster:
            import ray

            ray.shutdown()
    group_stats = {
        name: stats.group_statistics(
            [dataclasses.asdict(run) for run in runs if run.group == name],
            args.threshold,
            args.bootstrap_reps,
            args.bootstrap_seed,
        )
        for name in points
    }
    record = {
        "command": command,
        "train_flags": train_flags,
        "grid": args.grid,
        "seeds": args.seeds,
        "threshold": args.threshold,
        "launcher": args.launcher,
        "concurrency": concurrency,
        "run_declared_cpus": run_cpus,
        "bootstrap": {
            "reps": args.bootstrap_reps,
            "seed": args.bootstrap_seed,
            "confidence": stats.CONFIDENCE,
            "method": "rliable stratified bootstrap, percentile intervals",
        },
        "wall_time_s": time.monotonic() - start,
        "groups": group_stats,
    }
    write_results(args.sweep_dir, record, runs, points)
    _write_figure(args.sweep_dir, runs, args.threshold)
    print_tables(group_stats)
    failed = [run for run in runs if run.status not in ("finished", "skipped")]
    print(
        f"sweep: results in {os.path.join(args.sweep_dir, 'sweep.json')}, sweep.csv and "
        "sweep.png; "
        f"{len(failed)} of {len(runs)} runs did not finish",
        flush=True,
    )
    if interrupted:
        return 130
    return 1 if failed else 0


def _run_all(
    pending: list[Run], concurrency: int, args: argparse.Namespace, address: str | None
) -> bool:
    """Runs `pending`, `concurrency` at a time; True if Ctrl-C stopped the sweep."""
    stop = threading.Event()

    def one(run: Run) -> Run:
        if stop.is_set():
            return run
        print(f"[{run.group} seed={run.seed}] starting in {run.logdir}", flush=True)
        execute(run, "ray" if address else args.launcher, address, args.threshold)
        _report_end(run)
        if run.status == "interrupted":
            stop.set()
        return run

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency)
    try:
        list(pool.map(one, pending))
    except KeyboardInterrupt:
        stop.set()
    finally:
        pool.shutdown(wait=True)
    return stop.is_set()


def main(argv: Sequence[str]) -> int:
    own, train_flags = _split_argv(argv)
    args = _parser().parse_args(own)
    try:
        return sweep(args, train_flags, ["python", "-m", "launch.sweep", *argv])
    except SweepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
