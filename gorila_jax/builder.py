"""The one contract between an agent and the skeleton.

The skeleton (actor, learner, replay, evaluator, experiment) calls only what
`AgentBuilder` declares and never branches on which agent it runs. What only some
agents can do is a capability of its own, a protocol the skeleton checks with
`isinstance` (through the functions below it): `GorilaCapable` (Gorila mode's
parameter-server shards), `LearnsFromDemonstrations`, `TieredReplay`,
`CountsDuplicates` and `WritesTransitions`. An agent without one simply lacks its members.
"""

import threading
from typing import Any, Callable, NamedTuple, Protocol, Sequence, runtime_checkable

import jax

from gorila_jax import replay, types

# select_action(params, observation [E, ...], key, env_steps) -> action [E, ...], or
# (action, extras) with extras a pytree of [E, ...] arrays (a behaviour log-probability,
# a value) that the actor hands to the agent's adder with the step; jitted. Evaluation
# policies (make_policy(..., evaluation=True)) return the action alone.
# Randomness is the caller's: it hands a fresh `key` at every call (the actor and the
# evaluator one per vector step), and the policy draws from that key as it is, so the
# same key and env_steps give the same action. `env_steps`, the caller's env-step count,
# is for schedules (DQN's epsilon, SAC's random first steps), not a source of randomness.
Policy = Callable[
    [types.Params, jax.Array, jax.Array, jax.Array], jax.Array | tuple[jax.Array, types.PyTree]
]


def split_policy_output(output: Any) -> tuple[Any, types.PyTree]:
    """(action, extras) of a policy's output; extras is None when it returned only the action."""
    if isinstance(output, tuple):
        action, extras = output
        return action, extras
    return output, None


class SampledBatch(NamedTuple):
    """What a learner step receives, per device: [B/D, ...] leaves."""

    data: types.PyTree
    probabilities: jax.Array  # [B/D] sampling probability of each item
    table_size: jax.Array  # [B/D] table size when the item was sampled
    # [B/D] bool rows from the demonstration table (`replay.MixedSampler`); None: none.
    demo: jax.Array | None = None


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
      over devices and clipped (a parameter server gets slices, so any clip
      that needs the whole gradient happens here), possibly wrapped in
      `precision.CheckedGrads` with the step's skip flag. StepInfo.metrics
      holds at least "loss" (Gorila workers filter outliers on it).
    apply_grads(state, grads) -> state; elementwise over the parameters.
    update(state, SampledBatch) -> (state, StepInfo): optional. An agent whose
      step is more than one gradient (PPO's epochs of minibatches) gives its
      whole step here; the synchronous learner then runs it instead of the
      pair above, and Gorila mode, which needs the pair, refuses the agent.
    track_grads(state, grads) -> state: optional. The part of `apply_grads`
      that stays with a Gorila worker when the shards apply the gradient:
      fp16's dynamic loss scale, which must grow after finite gradients and
      shrink after overflows. Without it a worker only runs `apply_grads` on
      overflowed gradients (a skipped step), so its loss scale never grows.
    """

    compute_grads: Callable[[Any, SampledBatch], tuple[Any, StepInfo]] | None
    apply_grads: Callable[[Any, Any], Any] | None
    update: Callable[[Any, SampledBatch], tuple[Any, StepInfo]] | None = None
    track_grads: Callable[[Any, Any], Any] | None = None


def initial_train_state(builder: "AgentBuilder", spec: types.EnvSpec, seed: int) -> Any:
    """The learner's starting state for root `seed`.

    Every process that needs it builds the same one: the learner, each Gorila
    shard (its slice of the parameters) and a resume's restore target.
    """
    return builder.init_train_state(jax.random.fold_in(jax.random.PRNGKey(seed), 0), spec)


# ((first learner step, global batch size), ...), sorted by step, first step 0.
BatchSchedule = tuple[tuple[int, int], ...]


def growing_batch_schedule(start: int, maximum: int, growth_steps: int) -> BatchSchedule:
    """The batch doubles from `start` until it reaches `maximum`, in even steps.

    Doubling (not a linear ramp) keeps the number of distinct sizes, and so of
    learner recompilations, at log2(maximum / start) + 1. `maximum` <= `start`
    gives a fixed batch.
    """
    sizes = [start]
    while sizes[-1] < maximum:
        sizes.append(min(2 * sizes[-1], maximum))
    if len(sizes) == 1:
        return ((0, start),)
    stride = growth_steps / (len(sizes) - 1)
    return tuple((round(index * stride), size) for index, size in enumerate(sizes))


def batch_size_at(schedule: BatchSchedule, learner_step: int) -> int:
    """The global batch size the schedule gives at `learner_step`."""
    size = schedule[0][1]
    for first_step, scheduled in schedule:
        if learner_step >= first_step:
            size = scheduled
    return size


class Adder(Protocol):
    """Turns an actor's env steps into replay items."""

    def add(self, step: types.EnvStep) -> None: ...

    def close(self) -> None: ...


class AdderFactory(Protocol):
    """Makes an actor's adder for its vector of `num_envs` rows, writing through
    `connection` (`connection.writer(table)`); `table`: write there instead of the
    sampled table (the demonstration table, which `gorila_jax.demonstrations` fills)."""

    def __call__(
        self,
        connection: replay.Connection,
        num_envs: int,
        stop_event: threading.Event,
        table: str | None = None,
    ) -> Adder: ...


class ReplayLayout(NamedTuple):
    """Where an agent's items go and how they are packed, for one env spec.

    Attributes:
      tables: every table the agent's items go to, declared for the whole replay; any
        backend builds them (`gorila_jax/replay/api.py`).
      sample_table: the one of them the learner samples from.
      codec: how one item of `sample_table` is packed (actors) and unpacked (learner).
      make_adder: an actor's adder (`AdderFactory`).
    """

    tables: Sequence[replay.TableSpec]
    sample_table: str
    codec: replay.ItemCodec
    make_adder: AdderFactory

    @property
    def sampled(self) -> replay.TableSpec:
        """The declaration of `sample_table`."""
        return next(table for table in self.tables if table.name == self.sample_table)


class BatchPlan(NamedTuple):
    """How the learner takes its batches.

    Attributes:
      schedule: the global batch size by learner step (`growing_batch_schedule`);
        `((0, size),)` when it is fixed. Each batch is split over the learner devices.
      updates_per_dispatch: updates the one-host learner runs in one device call, each on
        its own batch, all sampled at once; 1 for an agent whose batches must be fresh.
      first_update_after: the env steps the actors take before the learner's first
        update can happen, and the setting that makes it so, as a refusal names it.
    """

    schedule: BatchSchedule
    updates_per_dispatch: int
    first_update_after: tuple[int, str]

    @property
    def batch_size(self) -> int:
        """The first global batch size (the only one, unless it grows)."""
        return self.schedule[0][1]

    @property
    def largest_batch(self) -> int:
        return max(size for _, size in self.schedule)

    def batch_size_at(self, learner_step: int) -> int:
        return batch_size_at(self.schedule, learner_step)


class StateAccess(NamedTuple):
    """What the skeleton reads from, and writes into, an agent's learner state.

    Attributes:
      actor_params: state -> the part of it that actors act with.
      trainable_params: state -> the parameters the agent's optimizers train: those the
        gradients of `update_fns().compute_grads` are for, the ones the numeric guard's
        learning-rate scale slows and a rollback's noise perturbs.
      with_trainable_params: (state, params shaped as `trainable_params(state)`) -> the
        state with them in their place and nothing else changed; jittable, called
        inside the learner step.
    """

    actor_params: Callable[[Any], types.Params]
    trainable_params: Callable[[Any], types.Params]
    with_trainable_params: Callable[[Any, types.Params], Any]


class AgentBuilder(Protocol):
    """What the skeleton needs from an agent: eight members. Implementations hold no logic."""

    config: Any  # the agent's hyperparameters, a dataclass (written to summary.json)

    def validate(self, num_learner_devices: int, spec: types.EnvSpec | None = None) -> None:
        """Raises ValueError for a config that cannot run on this many devices (or env)."""

    def replay_layout(self, spec: types.EnvSpec) -> ReplayLayout:
        """The agent's replay tables, its sampled table, item codec and adder."""

    @property
    def batch_plan(self) -> BatchPlan:
        """The learner's batch sizes, updates per device call and first update."""

    @property
    def state_access(self) -> StateAccess:
        """Readers and writer of the parts of the learner state the skeleton handles."""

    def init_train_state(self, key: jax.Array, spec: types.EnvSpec) -> Any: ...

    def update_fns(self, spec: types.EnvSpec) -> UpdateFns: ...

    def make_policy(
        self, spec: types.EnvSpec, actor_index: int, num_actors: int, evaluation: bool
    ) -> Policy: ...


# ---------------------------------------------------------------- capabilities


@runtime_checkable
class GorilaCapable(Protocol):
    """An agent that runs in Gorila mode (`--learner_mode=gorila`): parameter-server
    shards own its trainable parameters and apply its elementwise optimizer to their
    slices; gradient workers keep the rest of the state (targets, counters). Its
    `update_fns` also give `compute_grads` and `apply_grads`."""

    def shard_optimizer(self) -> Any:
        """The optax optimizer a shard applies to its slice (must be elementwise)."""

    def with_params(self, state: Any, params: types.Params, step: int) -> Any:
        """A worker's state on parameters pulled from the shards at global update `step`."""


@runtime_checkable
class LearnsFromDemonstrations(Protocol):
    """An agent that can learn from recorded episodes (`--demos`): off-policy."""

    @property
    def demo_fraction(self) -> float:
        """The share of every learner batch drawn from demonstrations
        (`replay.MixedSampler`); 0 without them."""


@runtime_checkable
class TieredReplay(Protocol):
    """An agent whose sampled table can keep its older items on disk."""

    @property
    def replay_tiers(self) -> tuple[int, int] | None:
        """(hot, cold) items of its sampled table when tiered (`replay.Tiering`: the newest
        in memory, older ones on disk); None: all in memory."""


@runtime_checkable
class CountsDuplicates(Protocol):
    """An agent with prioritized replay that can raise the priority of a transition
    several actors wrote (duplicate-aware priority)."""

    def duplicate_counter(self) -> replay.DuplicateCounter | None:
        """What adds eps * sqrt(N) to the new priority of a transition N actors wrote;
        None: off."""


@runtime_checkable
class WritesTransitions(Protocol):
    """An agent whose actors write n-step transitions (`replay.NStepAdder`), which an Anakin
    learner makes on the device instead (`--launcher=anakin`)."""

    def n_step(self) -> replay.NStep:
        """Its n, discount and the priority new items are written at."""


def demo_fraction(builder: AgentBuilder) -> float | None:
    """The agent's share of demonstrations in a batch; None: it cannot learn from them."""
    return builder.demo_fraction if isinstance(builder, LearnsFromDemonstrations) else None


def replay_tiers(builder: AgentBuilder) -> tuple[int, int] | None:
    """The agent's (hot, cold) replay tiers; None: all in memory (also when it cannot tier)."""
    return builder.replay_tiers if isinstance(builder, TieredReplay) else None


def replay_tables(builder: AgentBuilder, spec: types.EnvSpec) -> list[replay.TableSpec]:
    """The agent's replay tables for `spec`: what a replay node builds (picklable with
    `functools.partial`, for a node in another process)."""
    return list(builder.replay_layout(spec).tables)


def n_step(builder: AgentBuilder) -> replay.NStep | None:
    """How the agent's transitions are made; None: it writes none (PPO's chunks)."""
    return builder.n_step() if isinstance(builder, WritesTransitions) else None


def duplicate_counter(builder: AgentBuilder) -> replay.DuplicateCounter | None:
    """The agent's duplicate counter; None: off, or an agent without priorities."""
    return builder.duplicate_counter() if isinstance(builder, CountsDuplicates) else None
