"""PPOBuilder: wires PPO's config, network, learning and policy into the skeleton."""

import dataclasses

import jax
import numpy as np

from agents.ppo import config as config_lib
from agents.ppo import learning, networks, policy
from gorila_jax import builder as builder_lib
from gorila_jax import precision, replay, types

TABLE = "trajectory_queue"


@dataclasses.dataclass(frozen=True)
class PPOBuilder:
    """Implements `gorila_jax.builder.AgentBuilder` for PPO on a trajectory queue.

    PPO's learner step is many gradient steps (`UpdateFns.update`), so it runs
    with the synchronous learner only; Gorila mode's parameter-server shards
    apply one gradient at a time and cannot host it.
    """

    config: config_lib.PPOConfig

    @property
    def batch_plan(self) -> builder_lib.BatchPlan:
        cfg = self.config
        first = (
            cfg.global_batch_size * cfg.trajectory_length,
            (
                f"a batch of {cfg.global_batch_size} chunks of "
                f"config.trajectory_length={cfg.trajectory_length} env steps"
            ),
        )
        # One queue batch per update (updates_per_dispatch 1): its epochs are the update's
        # own loop.
        return builder_lib.BatchPlan(((0, cfg.global_batch_size),), 1, first)

    def validate(self, num_learner_devices: int, spec: types.EnvSpec | None = None) -> None:
        self.config.validate(num_learner_devices)
        if spec is not None:
            self._network(spec)  # raises for a torso or action space that does not fit

    def _network(self, spec: types.EnvSpec) -> networks.ActorCritic:
        cfg = self.config
        return networks.make_network(
            spec,
            cfg.hidden_sizes,
            cfg.torso,
            cfg.activation,
            cfg.init_log_std,
            precision.compute_dtype(cfg.precision),
        )

    def _extras_example(self, spec: types.EnvSpec) -> learning.PolicyExtras:
        raw_action = np.zeros(spec.action_shape, np.int32 if spec.discrete else np.float32)
        return learning.PolicyExtras(np.float32(0), np.float32(0), raw_action)

    def replay_layout(self, spec: types.EnvSpec) -> builder_lib.ReplayLayout:
        cfg = self.config
        codec = replay.ItemCodec(
            replay.trajectory_example(spec, cfg.trajectory_length, self._extras_example(spec))
        )
        table = replay.queue_table(
            TABLE, cfg.queue_batches * cfg.global_batch_size, codec.num_bytes
        )

        def make_adder(connection, num_envs, stop_event, table=None):
            # At most one write of unconfirmed chunks: once the queue is full the
            # actor waits at its next write instead of running further ahead.
            writer = connection.writer(
                table or TABLE, max_pending=max(2, num_envs), stop_event=stop_event
            )
            return replay.TrajectoryAdder(writer, codec, num_envs, cfg.trajectory_length)

        return builder_lib.ReplayLayout([table], TABLE, codec, make_adder)

    def init_train_state(self, key: jax.Array, spec: types.EnvSpec) -> learning.TrainState:
        return learning.init_train_state(key, self._network(spec).init, spec, self.config)

    def update_fns(self, spec: types.EnvSpec) -> builder_lib.UpdateFns:
        return learning.make_update_fns(
            self._network(spec), networks.make_distribution(spec), self.config
        )

    @property
    def state_access(self) -> builder_lib.StateAccess:
        return builder_lib.StateAccess(
            actor_params=lambda state: learning.ActorParams(state.params, state.obs_stats),
            trainable_params=lambda state: state.params,
            with_trainable_params=lambda state, params: state._replace(params=params),
        )

    def make_policy(
        self, spec: types.EnvSpec, actor_index: int, num_actors: int, evaluation: bool
    ) -> builder_lib.Policy:
        network, distribution = self._network(spec), networks.make_distribution(spec)
        if evaluation:
            return policy.make_greedy_policy(network, distribution, self.config)
        if num_actors != self.config.num_actors:
            raise ValueError(
                f"config.num_actors={self.config.num_actors} but the experiment runs "
                f"{num_actors} actors; set --config.num_actors={num_actors} (it sizes the "
                "per-actor KL report and, with scale_batch_with_actors, the batch)"
            )
        return policy.make_acting_policy(network, distribution, self.config)

    # Not `builder.GorilaCapable`: PPO runs with learner_mode=sync only. Its learner step
    # is several epochs of minibatch updates, which parameter-server shards cannot apply
    # as one gradient (compute_grads/apply_grads).
