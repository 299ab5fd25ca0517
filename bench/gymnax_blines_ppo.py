"""gymnax-blines' published MinAtar PPO checkpoints (RobertTLange/gymnax-blines,
`agents/<Game>-MinAtar/ppo.pkl`) evaluated here, beside what their own log says.

Those checkpoints are what `--preset=minatar_gymnax` reproduces the settings of (64 envs x
128 steps, 10M env steps). Each pickle holds the final parameters and the returns its
training logged: the sampled policy's mean over 164 episodes, every 320k env steps. This
script plays the final parameters both ways, so our runs can be set beside them by the
same statistic:
  - greedy, 10 episodes, as our runs' final evaluation does, once per seed;
  - sampled, 164 episodes, as their log does (which also checks the network read back:
    it should come close to the log's last figure).

Runs in PureJaxRL's venv (bench/purejaxrl-requirements.txt: JAX and gymnax):

  /tmp/pjx-venv/bin/python bench/gymnax_blines_ppo.py --blines_dir=/path/to/gymnax-blines

Last line: JSON.
"""

import argparse
import json
import os
import pickle
import statistics
import sys
import types

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from gymnax_episodes import episode_returns


def load(path: str) -> dict:
    # The pickle's train_config is a dotmap.DotMap. That package is not worth installing
    # for a field this script does not read: a dict stands in for it while unpickling.
    class DotMap(dict):
        def __setstate__(self, state):
            self.update(state if isinstance(state, dict) else {})

    stand_in = types.ModuleType("dotmap")
    stand_in.DotMap = DotMap
    sys.modules.setdefault("dotmap", stand_in)
    with open(path, "rb") as f:
        return pickle.load(f)


def actor_logits(params: dict, obs: jax.Array) -> jax.Array:
    """Their CategoricalSeparateMLP's policy: two ReLU layers on the flattened grid, then logits."""
    x = obs.reshape(obs.shape[0], -1)
    for layer in ("Dense_0", "Dense_1"):
        x = jax.nn.relu(x @ params[layer]["kernel"] + params[layer]["bias"])
    return x @ params["Dense_2"]["kernel"] + params["Dense_2"]["bias"]


def evaluate(game: str, args: argparse.Namespace) -> dict:
    saved = load(os.path.join(args.blines_dir, "agents", f"{game}-MinAtar", "ppo.pkl"))
    params = jax.tree.map(jnp.asarray, saved["network"]["params"])
    env, env_params = gymnax.make(f"{game}-MinAtar")

    def greedy(obs, _key):
        return jnp.argmax(actor_logits(params, obs), axis=-1)

    def sampled(obs, key):
        return jax.random.categorical(key, actor_logits(params, obs))

    def player(act, episodes: int):
        # Compiled once, played for every seed.
        play = jax.jit(lambda key: episode_returns(env, env_params, act, key, episodes))
        return lambda seed: [float(r) for r in play(jax.random.PRNGKey(seed))]

    play_greedy = player(greedy, args.episodes)
    greedy_means = [float(np.mean(play_greedy(s))) for s in args.seeds]
    sampled_returns = player(sampled, args.sampled_episodes)(args.seeds[0])
    return {
        "logged_last_return": float(saved["log_return"][-1]),
        "logged_last_env_steps": int(saved["log_steps"][-1]),
        "greedy_per_seed": greedy_means,
        "greedy_median": statistics.median(greedy_means),
        "sampled_mean": float(np.mean(sampled_returns)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blines_dir", required=True, help="gymnax-blines' checkout.")
    parser.add_argument("--games", default="Breakout,SpaceInvaders")
    parser.add_argument("--seeds", default="1,2,3,4,5", help="Env seeds of the greedy plays.")
    parser.add_argument("--episodes", type=int, default=10, help="Greedy episodes per seed.")
    parser.add_argument("--sampled_episodes", type=int, default=164)
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    results = {}
    for game in args.games.split(","):
        results[game] = evaluate(game, args)
        print(f"{game}: {json.dumps(results[game])}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
