"""PPO acting: sample from the policy and record what the learner needs; greedy for evaluation."""

import jax

from agents.ppo import config as config_lib
from agents.ppo import learning, networks, normalization
from gorila_jax import builder as builder_lib


def make_acting_policy(
    network: networks.ActorCritic, distribution, cfg: config_lib.PPOConfig
) -> builder_lib.Policy:
    """A jitted `(ActorParams, obs [E, ...], key, env_steps) -> (action, PolicyExtras)`."""

    @jax.jit
    def select_action(actor_params: learning.ActorParams, obs, key, env_steps):
        del env_steps  # PPO has no schedule
        obs = normalization.prepare_observations(obs, actor_params.obs_stats, cfg)
        inputs, value = network.apply(actor_params.params, obs)
        raw_action = distribution.sample(key, inputs)
        log_prob = distribution.log_prob(inputs, raw_action)
        extras = learning.PolicyExtras(log_prob=log_prob, value=value, raw_action=raw_action)
        return distribution.to_env(raw_action), extras

    return select_action


def make_greedy_policy(
    network: networks.ActorCritic, distribution, cfg: config_lib.PPOConfig
) -> builder_lib.Policy:
    """A jitted `(ActorParams, obs, key, env_steps) -> action`: the distribution's mode."""

    @jax.jit
    def select_action(actor_params: learning.ActorParams, obs, key, env_steps):
        del key, env_steps  # deterministic
        obs = normalization.prepare_observations(obs, actor_params.obs_stats, cfg)
        inputs, _ = network.apply(actor_params.params, obs)
        return distribution.to_env(distribution.mode(inputs))

    return select_action
