"""DQNBuilder: wires DQN's config, network, learning and policy into the skeleton."""

import dataclasses
import threading

import jax
import numpy as np
import reverb

from agents.dqn import config as config_lib
from agents.dqn import learning, networks, policy
from gorila_jax import builder as builder_lib
from gorila_jax import replay, types, writers

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

    def validate(self, num_learner_devices: int) -> None:
        self.config.validate(num_learner_devices)

    def _network(self, spec: types.EnvSpec) -> networks.QNetwork:
        return networks.make_network(spec, self.config.hidden_sizes, self.config.dueling)

    def item_codec(self, spec: types.EnvSpec) -> replay.ItemCodec:
        one = spec.zeros_observation(1)[0]
        return replay.ItemCodec(
            types.Transition(one, np.int32(0), np.float32(0), np.float32(0), one)
        )

    def replay_tables(self, spec: types.EnvSpec) -> list[reverb.Table]:
        cfg = self.config
        limiter = replay.rate_limiter(cfg.samples_per_insert, cfg.min_replay_size, cfg.batch_size)
        signature = self.item_codec(spec).signature()
        return [
            replay.prioritized_table(
                TABLE, cfg.max_replay_size, cfg.priority_exponent, limiter, signature
            )
        ]

    def make_adder(
        self,
        client: reverb.Client,
        spec: types.EnvSpec,
        num_envs: int,
        stop_event: threading.Event,
    ) -> writers.NStepAdder:
        writer = writers.TransitionWriter(client, TABLE, stop_event=stop_event)
        return writers.NStepAdder(
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
            key, self._network(spec).init, optimizer, spec.zeros_observation(1)
        )

    def update_fns(self, spec: types.EnvSpec) -> builder_lib.UpdateFns:
        return learning.make_update_fns(
            self._network(spec).apply, learning.make_optimizer(self.config), self.config
        )

    def actor_params(self, state: learning.TrainState) -> types.Params:
        return state.params

    def make_policy(
        self, spec: types.EnvSpec, actor_index: int, num_actors: int, evaluation: bool
    ) -> builder_lib.Policy:
        cfg = self.config
        if evaluation:
            epsilon_fn = lambda env_steps: cfg.eval_epsilon  # noqa: E731
        else:
            end = policy.actor_epsilon_end(
                cfg.epsilon_end, cfg.epsilon_end_spread, actor_index, num_actors
            )
            epsilon_fn = lambda env_steps: policy.linear_epsilon(  # noqa: E731
                env_steps, cfg.epsilon_start, end, cfg.epsilon_decay_steps
            )
        return policy.make_epsilon_greedy(self._network(spec).apply, epsilon_fn)
