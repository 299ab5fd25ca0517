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
import time

import gymnasium as gym
import sbx
from sb3_evaluations import Evaluations, run_seeds


def run(args: argparse.Namespace, seed: int) -> dict:
    env = gym.make(args.env)
    # SBX's own default step size unless the zoo names one.
    step_size = {} if args.learning_rate is None else {"learning_rate": args.learning_rate}
    model = sbx.SAC("MlpPolicy", env, learning_starts=args.learning_starts, seed=seed, **step_size)
    evaluations = Evaluations(args.env, args.eval_every, args.eval_episodes, args.target, seed)
    start = time.monotonic()
    model.learn(total_timesteps=args.steps, callback=evaluations)
    seconds = time.monotonic() - start
    final = evaluations.evaluate()
    return {
        "peer": f"sbx {sbx.__version__} SAC",
        "env": args.env,
        "seed": seed,
        "steps": args.steps,
        "learning_starts": args.learning_starts,
        "learning_rate": model.learning_rate,
        "final_return": final,
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
    run_seeds("sbx_sac", args, run)


if __name__ == "__main__":
    main()
