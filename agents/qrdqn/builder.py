"""QRDQNBuilder: DQN's builder with a quantile network, loss and policy."""

import dataclasses

from agents.dqn import builder as dqn_builder
from agents.dqn import learning as dqn_learning
from agents.qrdqn import config as config_lib
from agents.qrdqn import learning, networks, policy
from gorila_jax import builder as builder_lib
from gorila_jax import precision, types


@dataclasses.dataclass(frozen=True)
class QRDQNBuilder(dqn_builder.DQNBuilder):
    """Implements `gorila_jax.builder.AgentBuilder` for QR-DQN with PER.

    Replay (the prioritized table, the n-step adder), the train state, the
    optimizer a Gorila shard applies, the target copy at a pull, the actor
    parameters and the epsilon schedule are DQN's, inherited. What differs
    is the network, the update's gradients and the policy's reading of the head.
    """

    config: config_lib.QRDQNConfig

    def _network(self, spec: types.EnvSpec) -> networks.QuantileNetwork:
        cfg = self.config
        return networks.make_network(
            spec,
            cfg.num_quantiles,
            cfg.hidden_sizes,
            cfg.dueling,
            cfg.torso,
            precision.compute_dtype(cfg.precision),
            cfg.layer_norm,
        )

    def update_fns(self, spec: types.EnvSpec) -> builder_lib.UpdateFns:
        return learning.make_update_fns(
            self._network(spec).apply, dqn_learning.make_optimizer(self.config), self.config
        )

    def make_policy(
        self, spec: types.EnvSpec, actor_index: int, num_actors: int, evaluation: bool
    ) -> builder_lib.Policy:
        epsilon_fn = self._epsilon_fn(actor_index, num_actors, evaluation)
        return policy.make_epsilon_greedy(self._network(spec).apply, epsilon_fn)
