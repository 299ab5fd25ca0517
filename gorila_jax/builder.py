"""The one contract between an agent and the skeleton.

The skeleton (actor, learner, replay, evaluator, experiment) calls only what
`AgentBuilder` declares and never branches on which agent it runs.
"""

import threading
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import jax
import reverb

from gorila_jax import replay, types

# select_action(params, observation [E, ...], key, env_steps) -> action [E, ...]; jitted.
Policy = Callable[[types.Params, jax.Array, jax.Array, jax.Array], jax.Array]


class SampledBatch(NamedTuple):
    """What a learner step receives, per device: [B/D, ...] leaves."""

    data: types.PyTree
    probabilities: jax.Array  # [B/D] sampling probability of each item
    table_size: jax.Array  # [B/D] table size when the item was sampled


class StepInfo(NamedTuple):
    """What a learner step returns beside the new state.

    Attributes:
      priorities: [B/D] new priorities of the sampled items, or None when the
        agent's table does not use priorities.
      metrics: scalar metrics, already averaged over devices.
    """

    priorities: jax.Array | None
    metrics: dict[str, jax.Array]


class UpdateFns(NamedTuple):
    """Per-device functions, run by the learner under `jax.pmap`.

    compute_grads(state, SampledBatch) -> (grads, StepInfo); grads are averaged
      over devices and clipped as a whole (a parameter server gets slices).
    apply_grads(state, grads) -> state; elementwise over the parameters.
    """

    compute_grads: Callable[[Any, SampledBatch], tuple[Any, StepInfo]]
    apply_grads: Callable[[Any, Any], Any]


class Adder(Protocol):
    """Turns an actor's env steps into replay items."""

    def add(self, step: types.EnvStep) -> None: ...

    def close(self) -> None: ...


class AgentBuilder(Protocol):
    """What the skeleton needs from an agent. Implementations hold no logic."""

    config: Any  # the agent's hyperparameters, a dataclass (written to summary.json)

    @property
    def sample_table(self) -> str:
        """The replay table the learner samples from."""

    @property
    def batch_size(self) -> int:
        """The global learner batch, split over learner devices."""

    def validate(self, num_learner_devices: int) -> None:
        """Raises ValueError for a config that cannot run on this many devices."""

    def item_codec(self, spec: types.EnvSpec) -> replay.ItemCodec:
        """How one item of the sampled table is packed (actors) and unpacked (learner)."""

    def replay_tables(self, spec: types.EnvSpec) -> Sequence[reverb.Table]: ...

    def make_adder(
        self,
        client: reverb.Client,
        spec: types.EnvSpec,
        num_envs: int,
        stop_event: threading.Event,
    ) -> Adder: ...

    def init_train_state(self, key: jax.Array, spec: types.EnvSpec) -> Any: ...

    def update_fns(self, spec: types.EnvSpec) -> UpdateFns: ...

    def actor_params(self, state: Any) -> types.Params:
        """The part of the learner state that actors act with."""

    def make_policy(
        self, spec: types.EnvSpec, actor_index: int, num_actors: int, evaluation: bool
    ) -> Policy: ...
