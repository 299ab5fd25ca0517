"""What the Stable-Baselines3 peers run here share (bench/sbx_sac.py, bench/sb3_ppo.py; in
their own venvs, no gorila_jax import): greedy evaluations during and after a run, and
the seeds run one after the other.

Ours reports the final greedy return (`launch.train`'s last evaluation): the peers report
the deterministic policy's mean over as many episodes, in an env of its own.
"""

import argparse
import json
import time
from typing import Callable

import gymnasium as gym
import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy


class Evaluations(BaseCallback):
    """Evaluates every `every` env steps (0: never); keeps the first wall time at `target`."""

    def __init__(self, env_id: str, every: int, episodes: int, target: float | None, seed: int):
        super().__init__()
        self.eval_env = gym.make(env_id)
        self.eval_env.reset(seed=seed + 10_000)
        self.every, self.episodes, self.target = every, episodes, target
        self.start = time.monotonic()
        self.curve: list[tuple[int, float, float]] = []
        self.reached: dict | None = None

    def _on_step(self) -> bool:
        # A vector env of E copies advances num_timesteps by E a call: `every` must be
        # a multiple of E to be hit.
        if self.every and self.num_timesteps % self.every == 0:
            mean = self.evaluate()
            seconds = time.monotonic() - self.start
            self.curve.append((self.num_timesteps, round(seconds, 1), mean))
            if self.reached is None and self.target is not None and mean >= self.target:
                self.reached = {"env_steps": self.num_timesteps, "seconds": round(seconds, 1)}
        return True

    def evaluate(self) -> float:
        """The deterministic policy's mean return over `episodes` episodes."""
        mean, _ = evaluate_policy(self.model, self.eval_env, self.episodes, deterministic=True)
        return float(mean)


def run_seeds(bench: str, args: argparse.Namespace, run: Callable[..., dict]) -> None:
    """`run(args, seed)` for each of `args.seeds` (comma-separated), one after the other:
    a JSON line per seed, then one with every final return and their mean."""
    finals = []
    for seed in (int(s) for s in args.seeds.split(",")):
        result = run(args, seed)
        finals.append(result["final_return"])
        print(json.dumps(result), flush=True)
    print(json.dumps({"bench": bench, "env": args.env, "finals": finals,
                      "mean": float(np.mean(finals))}))  # fmt: skip
