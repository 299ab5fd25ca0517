"""PPOBuilder: wires PPO's config, network, learning and policy into the skeleton."""

import dataclasses
import threading

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
    def sample_table(self) -> str:
        return TABLE

    @property
    def batch_size(self) -> int:
        return self.config.global_batch_size

    @property
    def updates_per_dispatch(self) -> int:
        return 1  # one queue batch per update: its epochs are the update's own loop

    @property
    def batch_schedule(self) -> builder_lib.BatchSchedule:
        return ((0, self.config.global_batch_size),)

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

    def item_codec(self, spec: types.EnvSpec) -> replay.ItemCodec:
        example = replay.trajectory_example(
            spec, self.config.trajectory_length, self._extras_example(spec)
        )
        return replay.ItemCodec(example)

    def env_steps_before_first_update(self) -> tuple[int, str]:
        cfg = self.config
        return cfg.global_batch_size * cfg.trajectory_length, (
            f"a batch of {cfg.global_batch_size} chunks of "
            f"config.trajectory_length={cfg.trajectory_length} env steps"
        )

    def replay_tables(self, spec: types.EnvSpec) -> list[replay.TableSpec]:
        capacity = self.config.queue_batches * self.config.global_batch_size
        return [replay.queue_table(TABLE, capacity, self.item_codec(spec).num_bytes)]

    def make_adder(
        self,
        connection: replay.Connection,
        spec: types.EnvSpec,
        num_envs: int,
        stop_event: threading.Event,
        table: str | None = None,
    ) -> replay.TrajectoryAdder:
        # At most one write of unconfirmed chunks: once the queue is full the
        # actor waits at its next write instead of running further ahead.
        writer = connection.writer(
            table or TABLE, max_pending=max(2, num_envs), stop_event=stop_event
        )
        return replay.TrajectoryAdder(
            writer, self.item_codec(spec), num_envs, self.config.trajectory_length
        )

    def init_train_state(self, key: jax.Array, spec: types.EnvSpec) -> learning.TrainState:
        return learning.init_train_state(key, self._network(spec).init, spec, self.config)

    def update_fns(self, spec: types.EnvSpec) -> builder_lib.UpdateFns:
        return learning.make_update_fns(
            self._network(spec), networks.make_distribution(spec), self.config
        )

    def actor_params(self, state: learning.TrainState) -> learning.ActorParams:
        return learning.ActorParams(state.params, state.obs_stats)

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

    def trainable_params(self, state: learning.TrainState) -> types.Params:
        return state.params

    def with_trainable_params(
        self, state: learning.TrainState, params: types.Params
    ) -> learning.TrainState:
        return state._replace(params=params)

    # Not `builder.GorilaCapable`: PPO runs with learner_mode=sync only. Its learner step
    # is several epochs of minibatch updates, which parameter-server shards cannot apply
    # as one gradient (compute_grads/apply_grads).
