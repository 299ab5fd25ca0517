"""QR-DQN acting: DQN's epsilon-greedy on the mean of each action's quantiles."""

from typing import Callable

from agents.dqn import policy as dqn_policy
from gorila_jax import builder as builder_lib


def mean_q(quantile_apply: Callable) -> Callable:
    """`apply(params, obs) -> [B, A]` Q-values: the mean over each action's N quantiles.

    The mean of equally weighted quantiles estimates the expected return, the
    quantity a greedy policy maximizes (Dabney et al., 2018, sec. 4).
    """
    return lambda params, obs: quantile_apply(params, obs).mean(axis=-1)


def make_epsilon_greedy(quantile_apply: Callable, epsilon_fn: Callable) -> builder_lib.Policy:
    """A jitted `select_action(params, obs [E, ...], key, env_steps) -> action [E]`."""
    return dqn_policy.make_epsilon_greedy(mean_q(quantile_apply), epsilon_fn)
