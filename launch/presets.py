"""Named starting points for an agent's config and the experiment settings.

A preset returns the agent config and the experiment fields it changes;
explicit flags (`--num_actors`, `--config.batch_size`, ...) win over it.
"""

import dataclasses
from typing import Any

from agents import dqn

NAMES = ("auto", "default", "cartpole")


def resolve(name: str, env_id: str) -> str:
    """`auto` picks the preset made for the env, else the brief's defaults."""
    if name != "auto":
        return name
    return "cartpole" if env_id.startswith("CartPole") else "default"


def dqn_preset(name: str) -> tuple[dqn.DQNConfig, dict[str, Any]]:
    """DQN config and experiment settings of preset `name` (not `auto`)."""
    if name == "default":
        return dqn.DQNConfig(), {}
    if name == "cartpole":
        # Solves CartPole-v1 (final greedy return >= 475; 495.8-500 in 4 of 4
        # runs, both launchers, seeds 0 and 1) in 120k env steps, about 2.5-3
        # minutes on 2 CPU cores. Why these values differ from the brief's:
        # - gamma 0.995: with 0.99 greedy policies plateau near 300 steps,
        #   drifting off the track, a failure too far ahead for a 100-step
        #   horizon to see;
        # - epsilon ends at 0.01: with 0.05 the final greedy return varied
        #   between 450 and 500 from run to run; near-greedy training episodes
        #   show the learner the slow drift that the greedy policy must fix;
        # - the cosine schedule reaches 0 at the end of the budget (120k env
        #   steps x 8 samples per insert / 64 per batch = 15k updates), so the
        #   run ends on small, stable updates;
        # - a replay ratio of 8 and target copies every 50 updates: ratios of
        #   16 and more, or copies every 10-25 updates, diverged in some runs.
        config = dataclasses.replace(
            dqn.DQNConfig(),
            hidden_sizes=(256, 256),
            discount=0.995,
            learning_rate=1e-3,
            learning_rate_decay_steps=15_000,
            learning_rate_final_fraction=0.0,
            adam_eps=1e-8,
            batch_size=64,
            target_update_period=50,
            samples_per_insert=8.0,
            min_replay_size=1_000,
            max_replay_size=120_000,
            importance_exponent_anneal_steps=15_000,
            epsilon_end=0.01,
            epsilon_decay_steps=8_000,
        )
        return config, {"total_env_steps": 120_000, "num_envs_per_actor": 8}
    raise ValueError(f"unknown preset {name!r}; choose one of {NAMES}")


AGENT_PRESETS = {"dqn": dqn_preset}
