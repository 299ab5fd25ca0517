"""SBX's SAC run here, the peer of ours on HalfCheetah-v4 and Walker2d-v4 at 100k (issue 36).

Runs in SBX's own venv (bench/sbx-requirements.txt; no gorila_jax import), one seed after
the other:

  /tmp/sbx-venv/bin/python bench/sbx_sac.py --env=HalfCheetah-v4 --steps=100000 --seeds=1,2,3

SAC with SBX's defaults and RL Zoo's changes (rl-zoo3's hyperparams/sac.yml): for MuJoCo
`learning_starts=10000` (the default here); for Pendulum-v1 `learning_rate=1e-3` alone:

  /tmp/sbx-venv/bin/python bench/sbx_sac.py --env=Pendulum-v1 --steps=20000 \
      --learning_starts=100 --learning_rate=1e-3 --eval_every=2000 --target=-157

Every `--eval_every` env steps the deterministic policy
plays `--eval_episodes` episodes in an env of its own; the wall time (evaluations
included) at which that mean first reaches `--target` is the time to the reference
return. The final return: the deterministic policy's mean over `--eval_episodes` after
the last step, as ours (`launch.train`'s final greedy evaluation). One JSON line per
seed; nothing is asserted.
"""

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import sbx
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy


class _Evaluations(BaseCallback):
    """Evaluates every `every` env steps; keeps the first wall time at `target`."""

    def __init__(self, env_id: str, every: int, episodes: int, target: float | None, seed: int):
        super().__init__()
        self.eval_env = gym.make(env_id)
        self.eval_env.reset(seed=seed + 10_000)
        self.every, self.episodes, self.target = every, episodes, target
        self.start = time.monotonic()
        self.curve: list[tuple[int, float, float]] = []
        self.reached: dict | None = None

    def _on_step(self) -> bool:
        if self.every and self.num_timesteps % self.every == 0:
            mean, _ = evaluate_policy(self.model, self.eval_env, self.episodes, deterministic=True)
            seconds = time.monotonic() - self.start
            self.curve.append((self.num_timesteps, round(seconds, 1), float(mean)))
            if self.reached is None and self.target is not None and mean >= self.target:
                self.reached = {"env_steps": self.num_timesteps, "seconds": round(seconds, 1)}
        return True


def run(args: argparse.Namespace, seed: int) -> dict:
    env = gym.make(args.env)
    # SBX's own default step size unless the zoo names one.
    step_size = {} if args.learning_rate is None else {"learning_rate": args.learning_rate}
    model = sbx.SAC("MlpPolicy", env, learning_starts=args.learning_starts, seed=seed, **step_size)
    evaluations = _Evaluations(args.env, args.eval_every, args.eval_episodes, args.target, seed)
    start = time.monotonic()
    model.learn(total_timesteps=args.steps, callback=evaluations)
    seconds = time.monotonic() - start
    final, _ = evaluate_policy(model, evaluations.eval_env, args.eval_episodes, deterministic=True)
    return {
        "peer": f"sbx {sbx.__version__} SAC",
        "env": args.env,
        "seed": seed,
        "steps": args.steps,
        "learning_starts": args.learning_starts,
        "learning_rate": model.learning_rate,
        "final_return": float(final),
        "wall_s": round(seconds, 1),
        "env_steps_per_s": round(args.steps / seconds, 1),
        "reached_target": evaluations.reached,
        "curve": evaluations.curve,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v4")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--learning_starts", type=int, default=10_000)
    parser.add_argument("--learning_rate", type=float, default=None, help="None: SBX's 3e-4")
    parser.add_argument("--eval_every", type=int, default=10_000, help="0: no evaluations")
    parser.add_argument("--eval_episodes", type=int, default=10)
    parser.add_argument("--target", type=float, default=None, help="the reference return")
    args = parser.parse_args()
    finals = []
    for seed in (int(s) for s in args.seeds.split(",")):
        result = run(args, seed)
        finals.append(result["final_return"])
        print(json.dumps(result), flush=True)
    print(json.dumps({"bench": "sbx_sac", "env": args.env, "finals": finals,
                      "mean": float(np.mean(finals))}))  # fmt: skip


if __name__ == "__main__":
    main()
