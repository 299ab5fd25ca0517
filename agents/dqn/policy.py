"""DQN acting: epsilon-greedy on the online Q-network, epsilon falling linearly."""

from typing import Callable

import jax
import jax.numpy as jnp

from gorila_jax import builder as builder_lib


def linear_epsilon(env_steps: jax.Array, start: float, end: float, decay_steps: int) -> jax.Array:
    """Epsilon after `env_steps` steps: a straight line from `start` to `end`, then flat."""
    fraction = jnp.clip(env_steps / decay_steps, 0.0, 1.0)
    return start + fraction * (end - start)


def actor_epsilon_end(
    epsilon_end: float, spread: float, actor_index: int, num_actors: int
) -> float:
    """Final epsilon of actor `actor_index`: later actors explore less when spread > 0."""
    position = actor_index / (num_actors - 1) if num_actors > 1 else 0.0
    return epsilon_end * (1.0 - spread * position)


def make_epsilon_greedy(
    apply_fn: Callable, epsilon_fn: Callable[[jax.Array], jax.Array]
) -> builder_lib.Policy:
    """A jitted `select_action(params, obs [E, ...], key, env_steps) -> action [E]`.

    Epsilon follows `env_steps`; the random draws come from `key` alone.
    """

    @jax.jit
    def select_action(params, obs, key, env_steps):
        q = apply_fn(params, obs)  # [E, A]
        explore_key, action_key = jax.random.split(key)
        greedy = jnp.argmax(q, axis=-1)
        random = jax.random.randint(action_key, greedy.shape, 0, q.shape[-1])
        explore = jax.random.uniform(explore_key, greedy.shape) < epsilon_fn(env_steps)
        return jnp.where(explore, random, greedy).astype(jnp.int32)

    return select_action
