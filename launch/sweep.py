"""Runs seeds x a grid of overrides of `python -m launch.train` and reports statistics.

Examples:
  python -m launch.sweep --sweep_dir=runs/sweep1 --seeds=5 \
      --grid=config.learning_rate=1e-3,5e-4 --grid=num_actors=2,4 --threshold=475 \
      -- --agent=dqn --env=CartPole-v1
  python -m launch.sweep --sweep_dir=runs/sweep1 --launcher=ray ...  # runs side by side
  python -m launch.sweep --sweep_dir=runs/sweep2 --seeds=5 --launcher=anakin \
      -- --agent=ppo --env=gymnax/Breakout-MinAtar  # on-device runs, one after the other

Everything after `--` goes to every run; a grid key is a launch.train flag
(`config.x` is `--config.x`). A group is one grid point, a run is a group and a
seed (`--seed`), with its logdir at `<sweep_dir>/<group>/seed=<seed>`. Running
the same command again skips finished runs and resumes unfinished ones from
their checkpoints. See docs/sweeps.md.
"""

import argparse
import concurrent.futures
import contextlib
import dataclasses
import io
import itertools
import os
import sys
import threading
import time
from collections.abc import Sequence

from launch import stats, sweep_results, sweep_runs

# Flags the sweep sets for every run itself.
SWEEP_OWNED_FLAGS = ("seed", "logdir", "resume", "launcher", "ray_address")


class SweepError(ValueError):
    """A sweep that cannot start as asked; the message names the culprit."""


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


def declared_cpus(flags: Sequence[str], role: str | None = None, launcher: str = "local") -> float:
    """Parses and checks `flags` exactly as `python -m launch.train --launcher=<launcher>`
    does, without running.

    Returns:
      The CPUs the run's program declares (the sum over its nodes), what
      one run takes of a Ray cluster.

    Raises:
      SweepError: with launch.train's own error line (naming the flag or field); a
        `role` (--role) the run's task does not have.
    """
    from absl import flags as absl_flags

    from gorila_jax import multiagent
    from gorila_jax.run import experiment
    from launch import train

    registry = absl_flags.FLAGS
    argv = ["launch.train", *flags, f"--launcher={launcher}"]
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
        builder = train.make_builders(config)
        train.check_configs(builder, exp_config)
        roles = multiagent.roles_of(exp_config.env_id)
        if role is not None and role not in roles:
            has = f"its roles are {', '.join(roles)}" if roles else "it has one role"
            raise SweepError(
                f"--role={role}: the runs' task {exp_config.env_id} has no such role; {has}"
            )
        program = experiment.make_program(builder, exp_config)
    except SystemExit as error:
        message = stderr.getvalue().strip() or str(error.code)
        raise SweepError(f"{message.removeprefix('error: ')} (in {' '.join(flags)})") from None
    except ValueError as error:
        raise SweepError(f"{error} (in {' '.join(flags)})") from None
    finally:
        sys.argv = saved_argv
    return sum(program.resources(node.group).num_cpus for node in program.nodes)


def _ray_cluster(address: str | None, num_cpus: int | None) -> tuple[str, float, bool]:
    """The address and CPU count of the cluster the runs join: `address`'s, or a new one."""
    import ray

    if address:
        ray.init(address=address)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)
    cpus = ray.cluster_resources().get("CPU", 0.0)
    return ray.get_runtime_context().gcs_address, cpus, address is None


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
    parser.add_argument(
        "--role",
        default=None,
        help="For a task of several roles (mpe/simple_tag_v3): the role whose final greedy "
        "return (and threshold crossing) the sweep reports.",
    )
    parser.add_argument(
        "--launcher",
        choices=["local", "ray", "anakin"],
        default="local",
        help="How each run runs (launch.train's --launcher): local and anakin runs one "
        "after the other, ray runs side by side on one cluster.",
    )
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


def plan(
    args: argparse.Namespace, train_flags: list[str]
) -> tuple[list[sweep_runs.Run], dict, float]:
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
    if args.launcher != "ray":
        for name in ("ray_address", "ray_num_cpus", "max_concurrent"):
            if getattr(args, name):
                raise SweepError(
                    f"--{name} is for --launcher=ray; --launcher={args.launcher} runs one "
                    "run at a time on this machine"
                )
    _check_train_flags(train_flags)
    grid = parse_grid(args.grid)
    runs, points, cpus = [], {}, 0.0
    for name, flags in groups(grid):
        cpus = max(cpus, declared_cpus([*train_flags, *flags], args.role, args.launcher))
        points[name] = dict(zip([key for key, _ in grid], [f.split("=", 1)[1] for f in flags]))
        for seed in range(args.seeds):
            logdir = os.path.join(args.sweep_dir, name, f"seed={seed}")
            runs.append(sweep_runs.Run(name, seed, logdir, [*train_flags, *flags]))
    return runs, points, cpus


def _join_ray(args: argparse.Namespace, run_cpus: float, num_pending: int) -> tuple[int, str, bool]:
    """(runs at a time, cluster address, whether the sweep started the cluster) under ray.

    Raises:
      SweepError: one run declares more CPUs than the cluster has.
    """
    address, cluster_cpus, owns_cluster = _ray_cluster(args.ray_address, args.ray_num_cpus)
    if run_cpus > cluster_cpus:
        raise SweepError(
            f"a run declares {run_cpus:g} CPUs but the Ray cluster has {cluster_cpus:g}"
        )
    concurrency = max(1, int(cluster_cpus // run_cpus)) if run_cpus else num_pending
    if args.max_concurrent:
        concurrency = min(concurrency, args.max_concurrent)
    print(
        f"sweep: Ray cluster {address} with {cluster_cpus:g} CPUs; each run declares "
        f"{run_cpus:g}: {concurrency} at a time",
        flush=True,
    )
    return concurrency, address, owns_cluster


def _not_finished(
    runs: list[sweep_runs.Run], threshold: float | None, role: str | None = None
) -> list[sweep_runs.Run]:
    """The runs still to run; those that finished before are marked skipped, with results."""
    pending = []
    for run in runs:
        summary = sweep_runs.finished_summary(run.logdir)
        if summary is None:
            pending.append(run)
            continue
        run.status = "skipped"
        sweep_runs.read_result(run, summary, threshold, role)
        print(f"[{run.group} seed={run.seed}] skipped: finished before", flush=True)
    return pending


def sweep(args: argparse.Namespace, train_flags: list[str], command: list[str]) -> int:
    """Runs the sweep; the exit code is 0 only if every run finished."""
    start = time.monotonic()
    runs, points, run_cpus = plan(args, train_flags)
    os.makedirs(args.sweep_dir, exist_ok=True)
    pending = _not_finished(runs, args.threshold, args.role)
    print(
        f"sweep: {len(runs)} runs ({len(points)} groups x {args.seeds} seeds), "
        f"{len(runs) - len(pending)} finished before, {len(pending)} to run in {args.sweep_dir}",
        flush=True,
    )
    concurrency, address, owns_cluster = 1, None, False
    if args.launcher == "ray" and pending:
        concurrency, address, owns_cluster = _join_ray(args, run_cpus, len(pending))
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
        **{key: getattr(args, key) for key in ("grid", "seeds", "threshold", "launcher", "role")},
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
    sweep_results.write_results(args.sweep_dir, record, runs, points)
    sweep_results.write_figure(args.sweep_dir, runs, args.threshold)
    sweep_results.print_tables(group_stats)
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
    pending: list[sweep_runs.Run], concurrency: int, args: argparse.Namespace, address: str | None
) -> bool:
    """Runs `pending`, `concurrency` at a time; True if Ctrl-C stopped the sweep."""
    stop = threading.Event()

    def one(run: sweep_runs.Run) -> sweep_runs.Run:
        if stop.is_set():
            return run
        print(f"[{run.group} seed={run.seed}] starting in {run.logdir}", flush=True)
        launcher = "ray" if address else args.launcher
        sweep_runs.execute(run, launcher, address, args.threshold, args.role)
        sweep_results.report_end(run)
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
