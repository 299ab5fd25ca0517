"""DQNBuilder: wires DQN's config, network, learning and policy into the skeleton."""

import dataclasses

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
    def batch_plan(self) -> builder_lib.BatchPlan:
        cfg = self.config
        schedule = builder_lib.growing_batch_schedule(
            cfg.batch_size, cfg.batch_size_max, cfg.batch_growth_steps
        )
        first = (
            cfg.min_replay_size,
            (f"config.min_replay_size={cfg.min_replay_size} items in replay, one per env step"),
        )
        return builder_lib.BatchPlan(schedule, cfg.updates_per_dispatch, first)

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

    def _item_codec(self, spec: types.EnvSpec) -> replay.ItemCodec:
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

    def replay_layout(self, spec: types.EnvSpec) -> builder_lib.ReplayLayout:
        cfg, codec = self.config, self._item_codec(spec)
        rows = self.batch_plan.largest_batch * cfg.updates_per_dispatch  # one sample call
        limiter = replay.rate_limiter(cfg.samples_per_insert, cfg.min_replay_size, rows)
        table = replay.prioritized_table(
            TABLE, cfg.max_replay_size, cfg.priority_exponent, limiter, codec.num_bytes
        )

        def make_adder(connection, num_envs, stop_event, table=None):
            writer = connection.writer(table or TABLE, stop_event=stop_event)
            return replay.NStepAdder(writer, codec, num_envs, *self.n_step())

        return builder_lib.ReplayLayout([table], TABLE, codec, make_adder)

    def n_step(self) -> replay.NStep:
        cfg = self.config
        return replay.NStep(cfg.n_step, cfg.discount, cfg.initial_priority)

    def init_train_state(self, key: jax.Array, spec: types.EnvSpec) -> learning.TrainState:
        optimizer = learning.make_optimizer(self.config)
        return learning.init_train_state(
            key, self._network(spec).init, optimizer, spec.zeros_observation(1), self.config
        )

    def update_fns(self, spec: types.EnvSpec) -> builder_lib.UpdateFns:
        return learning.make_update_fns(
            self._network(spec).apply, learning.make_optimizer(self.config), self.config
        )

    @property
    def state_access(self) -> builder_lib.StateAccess:
        dtype = self.config.actor_params_dtype
        return builder_lib.StateAccess(
            # bfloat16 halves what crosses to actors; the network promotes it to its
            # compute dtype.
            actor_params=lambda state: precision.cast_floats(state.params, dtype),
            trainable_params=lambda state: state.params,
            with_trainable_params=lambda state, params: state._replace(params=params),
        )

    def make_policy(
        self, spec: types.EnvSpec, actor_index: int, num_actors: int, evaluation: bool
    ) -> builder_lib.Policy:
        epsilon_fn = self._epsilon_fn(actor_index, num_actors, evaluation)
        return policy.make_epsilon_greedy(self._network(spec).apply, epsilon_fn)

    def _epsilon_fn(self, actor_index: int, num_actors: int, evaluation: bool):
        """env steps -> epsilon: the evaluator's fixed one, or this actor's decaying one."""
        cfg = self.config
        if evaluation:
            return lambda env_steps: cfg.eval_epsilon
        end = self.final_epsilon(actor_index, num_actors)
        return lambda env_steps: policy.linear_epsilon(
            env_steps, cfg.epsilon_start, end, cfg.epsilon_decay_steps
        )

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

    # Gorila mode: shards own the parameters and the optimizer; workers keep the rest.

    def shard_optimizer(self):
        return learning.make_optimizer(self.config)

    def with_params(
        self, state: learning.TrainState, params: types.Params, step: int
    ) -> learning.TrainState:
        return learning.with_shard_params(state, params, step, self.config.target_update_period)
