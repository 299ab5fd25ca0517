"""What `python -m launch.sweep` costs on top of its runs, and how many runs ray overlaps.

Runs one sweep per launcher (a fresh sweep directory each, tiny CartPole runs)
and reads each run's process start and wall time back from sweep.json.

- local: the sweep's own wall time against the sum of its runs' process wall
  times (runs go one after another, so the difference is the sweep's share:
  the flag check before the first run, skipping, statistics, writing).
- ray: the concurrency achieved, the runs' summed process wall time over the
  span from the first start to the last end (the mean number running at
  once), against the most possible: the runs' count or what the cluster's
  CPUs allow (`concurrency` in sweep.json: cluster CPUs // the CPUs one run
  declares), whichever is smaller.

Last line: JSON.

  python bench/sweep_overhead.py --launchers=local,ray --seeds=2 --ray_num_cpus=8
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LAUNCHERS = flags.DEFINE_list("launchers", ["local", "ray"], "Sweep launchers to measure.")
_SEEDS = flags.DEFINE_integer("seeds", 2, "Seeds per group.")
_GRID = flags.DEFINE_string("grid", "config.learning_rate=1e-3,5e-4", "The sweep's one --grid.")
_ENV_STEPS = flags.DEFINE_integer("total_env_steps", 1500, "Env steps of each run.")
_RAY_CPUS = flags.DEFINE_integer("ray_num_cpus", 8, "CPUs of the Ray cluster the sweep starts.")
# Small shares so that several runs fit a small machine's cluster at once.
RUN_FLAGS = [
    "--agent=dqn",
    "--env=CartPole-v1",
    "--eval_episodes=2",
    "--eval_interval_s=1",
    "--log_interval_s=1",
    "--num_actors=1",
    "--num_envs_per_actor=4",
    "--num_learner_devices=1",
    "--checkpoint_interval_steps=0",
    "--cpus_per_actor=0.5",
    "--learner_cpus=0.5",
    "--replay_cpus=0.5",
]


def sweep_once(launcher: str) -> dict:
    sweep_dir = tempfile.mkdtemp(prefix=f"sweep-overhead-{launcher}-")
    command = [
        sys.executable,
        "-m",
        "launch.sweep",
        f"--sweep_dir={sweep_dir}",
        f"--seeds={_SEEDS.value}",
        f"--grid={_GRID.value}",
        f"--launcher={launcher}",
        f"--ray_num_cpus={_RAY_CPUS.value}",
        "--",
        *RUN_FLAGS,
        f"--total_env_steps={_ENV_STEPS.value}",
    ]
    start = time.time()
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    sweep_s = time.time() - start
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        record = json.load(f)
    runs = record["runs"]
    process_s = sum(run["process_wall_s"] for run in runs)
    span_s = max(run["process_start_unix"] + run["process_wall_s"] for run in runs) - min(
        run["process_start_unix"] for run in runs
    )
    return {
        "launcher": launcher,
        "runs": len(runs),
        "sweep_s": sweep_s,
        "sum_run_process_s": process_s,
        "sum_run_training_s": sum(run["wall_time_s"] for run in runs),
        "overhead_s": sweep_s - span_s,
        "sweep_over_sum_of_runs": sweep_s / process_s,
        "mean_runs_at_once": process_s / span_s,
        "max_runs_at_once": min(record["concurrency"], len(runs)),
    }


def main(argv):
    del argv
    results = []
    for launcher in _LAUNCHERS.value:
        result = sweep_once(launcher)
        results.append(result)
        print(
            f"{launcher}: {result['runs']} runs, sweep {result['sweep_s']:.1f}s, runs' processes "
            f"{result['sum_run_process_s']:.1f}s summed ({result['sum_run_training_s']:.1f}s of "
            f"it training), sweep / sum of runs {result['sweep_over_sum_of_runs']:.2f}, "
            f"outside the runs {result['overhead_s']:.1f}s; runs at once "
            f"{result['mean_runs_at_once']:.2f} of {result['max_runs_at_once']} possible "
            f"({result['mean_runs_at_once'] / result['max_runs_at_once']:.0%})",
            flush=True,
        )
    print(json.dumps(results))


if __name__ == "__main__":
    app.run(main)
