"""DQNBuilder: wires DQN's config, network, learning and policy into the skeleton."""

import dataclasses
import threading

import jax
import numpy as np

from agents.dqn import config as config_lib
from agents.dqn import learning, networks, policy
from gorila_jax import builder as builder_lib
from gorila_jax import precision, replay, types

TABLE = "priority_table"


@dataclasses.dataclass(frozen=True)
class DQNBuilder:
    """Implements `gorila_jax.builder.AgentBuilder` for double DQN with PER."""

    config: config_lib.DQNConfig

    @property
    def sample_table(self) -> str:
        return TABLE

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def updates_per_dispatch(self) -> int:
        return self.config.updates_per_dispatch

    @property
    def batch_schedule(self) -> builder_lib.BatchSchedule:
        cfg = self.config
        return builder_lib.growing_batch_schedule(
            cfg.batch_size, cfg.batch_size_max, cfg.batch_growth_steps
        )

    def validate(self, num_learner_devices: int, spec: types.EnvSpec | None = None) -> None:
        self.config.validate(num_learner_devices)
        if spec is not None:
            self._network(spec)  # raises for continuous actions or a torso that does not fit

    def _network(self, spec: types.EnvSpec) -> networks.QNetwork:
        cfg = self.config
        return networks.make_network(
            spec,
            cfg.hidden_sizes,
            cfg.dueling,
            cfg.torso,
            precision.compute_dtype(cfg.precision),
            cfg.layer_norm,
        )

    def item_codec(self, spec: types.EnvSpec) -> replay.ItemCodec:
        storage = replay.observation_storage(self.config.replay_obs_dtype, spec)
        return replay.transition_codec(spec.zeros_observation(1)[0], np.int32(0), storage)

    @property
    def demo_fraction(self) -> float:
        return self.config.demo_fraction

    @property
    def replay_tiers(self) -> tuple[int, int] | None:
        return self.config.replay_tiers

    def duplicate_counter(self) -> replay.DuplicateCounter | None:
        cfg = self.config
        if not cfg.priority_duplicate_bonus:
            return None
        return replay.DuplicateCounter(cfg.priority_duplicate_bonus, cfg.max_replay_size)

    def env_steps_before_first_update(self) -> tuple[int, str]:
        size = self.config.min_replay_size
        return size, f"config.min_replay_size={size} items in replay, one per env step"

    def replay_tables(self, spec: types.EnvSpec) -> list[replay.TableSpec]:
        cfg = self.config
        largest_batch = max(size for _, size in self.batch_schedule)
        rows = largest_batch * cfg.updates_per_dispatch  # what one sample call takes
        limiter = replay.rate_limiter(cfg.samples_per_insert, cfg.min_replay_size, rows)
        item_bytes = self.item_codec(spec).num_bytes
        return [
            replay.prioritized_table(
                TABLE, cfg.max_replay_size, cfg.priority_exponent, limiter, item_bytes
            )
        ]

    def make_adder(
        self,
        connection: replay.Connection,
        spec: types.EnvSpec,
        num_envs: int,
        stop_event: threading.Event,
        table: str | None = None,
    ) -> replay.NStepAdder:
        writer = connection.writer(table or TABLE, stop_event=stop_event)
        return replay.NStepAdder(
            writer,
            self.item_codec(spec),
            num_envs,
            self.config.n_step,
            self.config.discount,
            self.config.initial_priority,
        )

    def init_train_state(self, key: jax.Array, spec: types.EnvSpec) -> learning.TrainState:
        optimizer = learning.make_optimizer(self.config)
        return learning.init_train_state(
            key, self._network(spec).init, optimizer, spec.zeros_observation(1), self.config
        )

    def update_fns(self, spec: types.EnvSpec) -> builder_lib.UpdateFns:
        return learning.make_update_fns(
            self._network(spec).apply, learning.make_optimizer(self.config), self.config
        )

    def actor_params(self, state: learning.TrainState) -> types.Params:
        # bfloat16 halves what crosses to actors; the network promotes it to its compute dtype.
        return precision.cast_floats(state.params, self.config.actor_params_dtype)

    def make_policy(
        self, spec: types.EnvSpec, actor_index: int, num_actors: int, evaluation: bool
    ) -> builder_lib.Policy:
        cfg = self.config
        if evaluation:
            epsilon_fn = lambda env_steps: cfg.eval_epsilon  # noqa: E731
        else:
            end = self.final_epsilon(actor_index, num_actors)
            epsilon_fn = lambda env_steps: policy.linear_epsilon(  # noqa: E731
                env_steps, cfg.epsilon_start, end, cfg.epsilon_decay_steps
            )
        return policy.make_epsilon_greedy(self._network(spec).apply, epsilon_fn)

    def final_epsilon(self, actor_index: int, num_actors: int) -> float:
        """Actor `actor_index`'s epsilon once decayed, for a run launched with `num_actors`.

        Actors added to a running program (elastic actors, index >= num_actors)
        take the place of configured actor `actor_index % num_actors`: the
        spread formula would otherwise extrapolate past the last configured
        actor, below epsilon_end * (1 - spread) and, for large indices, below 0
        (an actor that never explores). Cycling rather than clamping to the
        last actor's value spreads added actors over the configured range as
        evenly as the launched ones, instead of making every added actor the
        least exploring one.
        """
        cfg = self.config
        position = actor_index % num_actors
        return policy.actor_epsilon_end(
            cfg.epsilon_end, cfg.epsilon_end_spread, position, num_actors
        )

    def trainable_params(self, state: learning.TrainState) -> types.Params:
        return state.params

    def with_trainable_params(
        self, state: learning.TrainState, params: types.Params
    ) -> learning.TrainState:
        return state._replace(params=params)

    # Gorila mode: shards own the parameters and the optimizer; workers keep the rest.

    def shard_optimizer(self):
        return learning.make_optimizer(self.config)

    def with_params(
        self, state: learning.TrainState, params: types.Params, step: int
    ) -> learning.TrainState:
        return learning.with_shard_params(state, params, step, self.config.target_update_period)
