"""Wall-clock seconds and env steps until an agent's greedy evaluation reaches a target.

Runs the training command (`python -m launch.train --agent=... --env=...`,
with the env's `auto` preset) under each launcher with `--stop_at_eval_return`,
and reads the first evaluation at or above the target from its summary.json.
Seconds count from the command's start, so interpreter, TensorFlow/JAX
imports, Ray start-up and compilation are included. Last line: JSON.
The defaults time DQN on CartPole-v1 (target 475):

  python bench/time_to_solve.py --launchers=local,ray --seeds=0
  python bench/time_to_solve.py --agent=sac --env=Pendulum-v1 --target=-250 --launchers=local
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_AGENT = flags.DEFINE_string("agent", "dqn", "launch.train's --agent.")
_ENV = flags.DEFINE_string("env", "CartPole-v1", "launch.train's --env.")
_LAUNCHERS = flags.DEFINE_list("launchers", ["local", "ray"], "Launchers to time.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds to run under each launcher.")
_TARGET = flags.DEFINE_float("target", 475.0, "Greedy evaluation return that counts as solved.")
_EVAL_INTERVAL = flags.DEFINE_float("eval_interval_s", 2.0, "Seconds between evaluations.")


def solve_once(
    agent: str, env: str, launcher: str, seed: int, target: float, eval_interval_s: float
) -> dict:
    logdir = tempfile.mkdtemp(prefix=f"solve-{agent}-{launcher}-{seed}-")
    command = [
        sys.executable,
        "-m",
        "launch.train",
        f"--agent={agent}",
        f"--env={env}",
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
            result = solve_once(
                _AGENT.value,
                _ENV.value,
                launcher,
                int(seed),
                _TARGET.value,
                _EVAL_INTERVAL.value,
            )
            results.append(result)
            print(
                f"{launcher:>5} seed {seed}: solved={result['solved']} after "
                f"{result['seconds_to_solve'] or float('nan'):.1f}s and "
                f"{result['env_steps_to_solve'] or 0:,} env steps; final greedy return "
                f"{result['final_eval_return']:.1f}",
                flush=True,
            )
    print(
        json.dumps(
            {
                "bench": "time_to_solve",
                "agent": _AGENT.value,
                "env": _ENV.value,
                "target": _TARGET.value,
                "runs": results,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
