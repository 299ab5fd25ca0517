"""Exploration of actors added to a running DQN program (elastic actors).

Actor i of N ends at epsilon_end * (1 - spread * i / (N - 1)). An actor
added past the configured N takes configured actor i % N's value, so every
actor's epsilon stays within [epsilon_end * (1 - spread), epsilon_end].
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import dqn
from gorila_jax import envs

SPEC = envs.env_spec("CartPole-v1")
# 4 configured actors ending at 0.4, 0.3, 0.2, 0.1.
SPREAD = dataclasses.replace(
    dqn.DQNConfig(), hidden_sizes=(32,), epsilon_end=0.4, epsilon_end_spread=0.75
)


@pytest.mark.parametrize(
    "actor_index, expected",
    [
        (0, 0.4),
        (3, 0.1),  # the last configured actor: the bottom of the range
        (4, 0.4),  # the first added actor: configured actor 0's value (extrapolated: 0.0)
        (5, 0.3),
        (7, 0.1),  # extrapolated: -0.2, an actor that would never explore
        (8, 0.4),
        (41, 0.3),  # far past N: still inside the range (extrapolated: -3.2)
    ],
)
def test_an_added_actor_takes_a_configured_actors_final_epsilon(actor_index, expected):
    builder = dqn.DQNBuilder(SPREAD)
    assert builder.final_epsilon(actor_index, num_actors=4) == pytest.approx(expected)


def test_one_configured_actor_gives_every_added_actor_epsilon_end():
    builder = dqn.DQNBuilder(SPREAD)
    assert [builder.final_epsilon(i, num_actors=1) for i in range(3)] == [0.4] * 3


def test_an_added_actor_explores_like_the_configured_actor_it_stands_for():
    # 2 configured actors ending at 1.0 (all random) and 0.0 (greedy); the
    # extrapolated formula would give the added actor/2 epsilon -1.0: greedy.
    cfg = dataclasses.replace(
        SPREAD, epsilon_start=1.0, epsilon_end=1.0, epsilon_end_spread=1.0, epsilon_decay_steps=1
    )
    builder = dqn.DQNBuilder(cfg)
    params = builder.init_train_state(jax.random.PRNGKey(0), SPEC).params
    obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    greedy = np.asarray(jnp.argmax(builder._network(SPEC).apply(params, obs), -1))
    after_decay = 10  # env steps past epsilon_decay_steps: the final epsilon acts

    def off_greedy(actor_index: int) -> float:
        act = builder.make_policy(SPEC, actor_index, 2, evaluation=False)
        actions = np.asarray(act(params, obs, jax.random.PRNGKey(1), after_decay))
        return float(np.mean(actions != greedy))

    assert off_greedy(1) == 0.0
    assert 0.35 < off_greedy(2) < 0.65, "added actor/2 does not explore like actor/0"
