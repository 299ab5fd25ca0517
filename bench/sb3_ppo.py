"""Stable-Baselines3's PPO with RL Zoo's settings, run here: the peer of ours on
LunarLander-v2 at 1M env steps (issue 36; RL Zoo's table says 242 for it).

Runs in a venv of its own (bench/sb3-requirements.txt; no gorila_jax import), one seed
after the other:

  /tmp/sb3-venv/bin/python bench/sb3_ppo.py --env=LunarLander-v2 --steps=1000000 --seeds=1,2,3

The settings are rl-baselines3-zoo's hyperparams/ppo.yml for LunarLander-v2 (commit
00128b5): 16 envs of 1024 steps, minibatches of 64, 4 epochs, discount 0.999, GAE 0.98,
entropy 0.01; SB3's defaults for the rest (lr 3e-4 constant, clip 0.2, 64x64 tanh MLPs).
The final return is the deterministic policy's mean over `--eval_episodes` after the last
step, as ours (`launch.train`'s final greedy evaluation). One JSON line per seed; nothing
is asserted.
"""

import argparse
import time

import stable_baselines3
import torch
from sb3_evaluations import Evaluations, run_seeds
from stable_baselines3.common.env_util import make_vec_env

# rl-baselines3-zoo, hyperparams/ppo.yml, by env: (n_envs, PPO's arguments). Only the envs
# whose zoo settings are written here run: another env would run these under its name.
ZOO_SETTINGS = {
    "LunarLander-v2": (
        16,
        {
            "n_steps": 1024,
            "batch_size": 64,
            "gae_lambda": 0.98,
            "gamma": 0.999,
            "n_epochs": 4,
            "ent_coef": 0.01,
        },
    ),
}


def run(args: argparse.Namespace, seed: int) -> dict:
    num_envs, settings = ZOO_SETTINGS[args.env]
    env = make_vec_env(args.env, n_envs=num_envs, seed=seed)
    model = stable_baselines3.PPO("MlpPolicy", env, seed=seed, device="cpu", **settings)
    evaluations = Evaluations(args.env, args.eval_every, args.eval_episodes, None, seed)
    start = time.monotonic()
    model.learn(total_timesteps=args.steps, callback=evaluations)
    seconds = time.monotonic() - start
    return {
        "peer": f"stable-baselines3 {stable_baselines3.__version__} PPO, RL Zoo's settings",
        "env": args.env,
        "seed": seed,
        "steps": model.num_timesteps,
        "final_return": evaluations.evaluate(),
        "wall_s": round(seconds, 1),
        "env_steps_per_s": round(model.num_timesteps / seconds, 1),
        "torch_threads": torch.get_num_threads(),
        "curve": evaluations.curve,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="LunarLander-v2", choices=sorted(ZOO_SETTINGS))
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--eval_every", type=int, default=100_000, help="0: none during the run")
    parser.add_argument("--eval_episodes", type=int, default=10)
    args = parser.parse_args()
    num_envs = ZOO_SETTINGS[args.env][0]
    if args.eval_every % num_envs:
        parser.error(f"--eval_every must be a multiple of the {num_envs} envs")
    run_seeds("sb3_ppo", args, run)


if __name__ == "__main__":
    main()
