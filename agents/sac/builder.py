"""SACBuilder: wires SAC's config, networks, learning and policy into the skeleton."""

import dataclasses

import jax
import numpy as np

from agents.sac import config as config_lib
from agents.sac import learning, networks, policy
from gorila_jax import builder as builder_lib
from gorila_jax import precision, replay, types

TABLE = "uniform_table"


def _stored_dtype(dtype_name: str) -> np.dtype:
    # MuJoCo observations come as float64; the networks compute in float32 at
    # most, so replay keeps float32 and half the bytes.
    return np.dtype(np.float32) if np.dtype(dtype_name) == np.float64 else np.dtype(dtype_name)


@dataclasses.dataclass(frozen=True)
class SACBuilder:
    """Implements `gorila_jax.builder.AgentBuilder` for SAC on continuous actions."""

    config: config_lib.SACConfig

    @property
    def batch_plan(self) -> builder_lib.BatchPlan:
        cfg = self.config
        first = (
            cfg.min_replay_size,
            (f"config.min_replay_size={cfg.min_replay_size} items in replay, one per env step"),
        )
        return builder_lib.BatchPlan(((0, cfg.batch_size),), cfg.updates_per_dispatch, first)

    def validate(self, num_learner_devices: int, spec: types.EnvSpec | None = None) -> None:
        self.config.validate(num_learner_devices)
        if spec is not None:
            self._networks(spec)  # raises for discrete actions

    def _networks(self, spec: types.EnvSpec) -> networks.SACNetworks:
        cfg = self.config
        return networks.make_networks(
            spec,
            cfg.hidden_sizes,
            cfg.log_std_min,
            cfg.log_std_max,
            precision.compute_dtype(cfg.precision),
        )

    def _item_codec(self, spec: types.EnvSpec) -> replay.ItemCodec:
        obs = np.zeros(spec.observation_shape, _stored_dtype(spec.observation_dtype))
        action = np.zeros(spec.action_shape, np.float32)
        storage = replay.observation_storage(self.config.replay_obs_dtype, spec)
        return replay.transition_codec(obs, action, storage)

    @property
    def demo_fraction(self) -> float:
        return self.config.demo_fraction

    @property
    def replay_tiers(self) -> tuple[int, int] | None:
        return self.config.replay_tiers

    def replay_layout(self, spec: types.EnvSpec) -> builder_lib.ReplayLayout:
        cfg, codec = self.config, self._item_codec(spec)
        rows = cfg.batch_size * cfg.updates_per_dispatch  # what one sample call takes
        limiter = replay.rate_limiter(cfg.samples_per_insert, cfg.min_replay_size, rows)
        table = replay.uniform_table(TABLE, cfg.max_replay_size, limiter, codec.num_bytes)

        def make_adder(connection, num_envs, stop_event, table=None):
            writer = connection.writer(table or TABLE, stop_event=stop_event)
            return replay.NStepAdder(writer, codec, num_envs, *self.n_step())

        return builder_lib.ReplayLayout([table], TABLE, codec, make_adder)

    def n_step(self) -> replay.NStep:
        return replay.NStep(self.config.n_step, self.config.discount)

    def init_train_state(self, key: jax.Array, spec: types.EnvSpec) -> learning.TrainState:
        return learning.init_train_state(
            key, self._networks(spec), learning.make_optimizers(self.config), spec, self.config
        )

    def update_fns(self, spec: types.EnvSpec) -> builder_lib.UpdateFns:
        return learning.make_update_fns(
            self._networks(spec), learning.make_optimizers(self.config), spec, self.config
        )

    @property
    def state_access(self) -> builder_lib.StateAccess:
        dtype = self.config.actor_params_dtype
        return builder_lib.StateAccess(
            # The policy parameters actors act with: the published half of a double
            # buffer. The learner step returns these as an output of their own (a buffer
            # apart from the state), and the learner node publishes that copy. The next
            # step donates and overwrites the state's buffers, never the published ones,
            # so an actor or evaluator reading the published copy never sees parameters
            # half-way through an update (tests/agents/sac/test_nodes.py checks this).
            actor_params=lambda state: precision.cast_floats(state.policy_params, dtype),
            # What the three optimizers train: the policy, both critics and the temperature.
            trainable_params=lambda state: {
                "policy_params": state.policy_params,
                "critic_params": state.critic_params,
                "log_alpha": state.log_alpha,
            },
            with_trainable_params=lambda state, params: state._replace(**params),
        )

    def make_policy(
        self, spec: types.EnvSpec, actor_index: int, num_actors: int, evaluation: bool
    ) -> builder_lib.Policy:
        random_steps = policy.actor_random_steps(self.config.random_steps, num_actors)
        return policy.make_policy(self._networks(spec).policy.apply, spec, evaluation, random_steps)

    # Not `builder.GorilaCapable`: Gorila mode needs (compute_grads, apply_grads) with one
    # elementwise optimizer; SAC's update steps three (policy, critics, temperature) in
    # sequence, which parameter-server shards cannot apply.
