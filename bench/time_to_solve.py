"""Wall-clock seconds and env steps until DQN's greedy evaluation reaches 475 on CartPole-v1.

Runs the default training command (`python -m launch.train`, the CartPole
preset) under each launcher with `--stop_at_eval_return`, and reads the first
evaluation at or above the target from its summary.json. Seconds count from
the command's start, so interpreter, TensorFlow/JAX imports, Ray start-up and
compilation are included. Last line: JSON.

  python bench/time_to_solve.py --launchers=local,ray --seeds=0
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LAUNCHERS = flags.DEFINE_list("launchers", ["local", "ray"], "Launchers to time.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds to run under each launcher.")
_TARGET = flags.DEFINE_float("target", 475.0, "Greedy evaluation return that counts as solved.")
_EVAL_INTERVAL = flags.DEFINE_float("eval_interval_s", 2.0, "Seconds between evaluations.")


def solve_once(launcher: str, seed: int, target: float, eval_interval_s: float) -> dict:
    logdir = tempfile.mkdtemp(prefix=f"solve-{launcher}-{seed}-")
    command = [
        sys.executable,
        "-m",
        "launch.train",
        f"--launcher={launcher}",
        f"--seed={seed}",
        f"--stop_at_eval_return={target}",
        f"--eval_interval_s={eval_interval_s}",
        f"--logdir={logdir}",
    ]
    start = time.time()
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    command_s = time.time() - start
    with open(os.path.join(logdir, "summary.json")) as f:
        summary = json.load(f)
    solved = next((e for e in summary["evaluations"] if e["eval_return"] >= target), None)
    return {
        "launcher": launcher,
        "seed": seed,
        "solved": solved is not None,
        "seconds_to_solve": solved["unix_time"] - start if solved else None,
        "env_steps_to_solve": solved["env_steps"] if solved else None,
        "command_seconds": command_s,
        "final_eval_return": summary["final_eval_return"],
    }


def main(argv):
    del argv
    results = []
    for launcher in _LAUNCHERS.value:
        for seed in _SEEDS.value:
            result = solve_once(launcher, int(seed), _TARGET.value, _EVAL_INTERVAL.value)
            results.append(result)
            print(
                f"{launcher:>5} seed {seed}: solved={result['solved']} after "
                f"{result['seconds_to_solve'] or float('nan'):.1f}s and "
                f"{result['env_steps_to_solve'] or 0:,} env steps; final greedy return "
                f"{result['final_eval_return']:.1f}",
                flush=True,
            )
    print(json.dumps({"bench": "time_to_solve", "target": _TARGET.value, "runs": results}))


if __name__ == "__main__":
    app.run(main)
