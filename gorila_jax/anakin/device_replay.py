"""An Anakin learner's replay, on its devices: n-step transitions made from its rollouts and
kept in a ring of arrays, sampled uniformly or by priority as the agent's table declares.

The same rules as the native replay and `replay.NStepAdder`, in fixed shapes:
- a transition leaves when its env has n steps after it, or when the episode ends with
  the return up to the end; a termination zeroes the bootstrap discount, a truncation
  keeps gamma**k (`replay.NStepAccumulator`);
- each device keeps its own ring of `max_size / D` items (a shard) and samples its share
  of every batch from it; an item's probability is that of being drawn in that way, the
  table size the items of all devices, so importance weights mean what they do in a
  sharded replay;
- a PRIORITIZED table samples in proportion to priority ** exponent; new items take the
  agent's initial priority; a NaN priority from the update keeps the item's old one.

Prioritized draws go in two stages, a block of slots by the block's summed weight, then a
slot of that block by its own: exact, and each draw reads about sqrt(capacity) weights
instead of all of them (a flat draw over 100k items cost a quarter of a MinAtar DQN
update here). The block sums are recomputed from the priorities wherever they change,
so they never drift.
"""

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from gorila_jax import parallel, replay, types


class Ring(NamedTuple):
    """One device's items.

    Attributes:
      items: `types.Transition` with [capacity, ...] leaves.
      priorities: [blocks * block size] float32, slot i's at i (0 where empty, and in the
        padding past the capacity).
      block_weights: [blocks] float32, each block's sum of priority ** exponent over its
        held slots (zeros for a uniform table, which does not use them).
      head: [] int32, the slot the next item goes to.
      size: [] int32, the items held.
    """

    items: types.Transition
    priorities: jax.Array
    block_weights: jax.Array
    head: jax.Array
    size: jax.Array

    @property
    def capacity(self) -> int:
        return jax.tree.leaves(self.items)[0].shape[0]

    @property
    def block_size(self) -> int:
        return self.priorities.shape[0] // self.block_weights.shape[0]


def _block_size(capacity: int) -> int:
    """The largest power of two at most sqrt(capacity)."""
    return 1 << (math.isqrt(capacity).bit_length() - 1)


def empty(example: types.Transition, capacity: int) -> Ring:
    """A ring of `capacity` items shaped as `example` (one item, no batch axis)."""
    items = jax.tree.map(
        lambda x: jnp.zeros((capacity, *jnp.shape(x)), jnp.asarray(x).dtype), example
    )
    block = _block_size(capacity)
    blocks = -(-capacity // block)
    return Ring(
        items,
        jnp.zeros(blocks * block, jnp.float32),
        jnp.zeros(blocks, jnp.float32),
        jnp.zeros((), jnp.int32),
        jnp.zeros((), jnp.int32),
    )


def _weights(ring: Ring, slots: jax.Array, exponent: float) -> jax.Array:
    """priority ** exponent of `slots` (any shape), 0 where nothing is held."""
    return jnp.where(slots < ring.size, ring.priorities[slots] ** exponent, 0.0)


def _block_slots(ring: Ring, blocks: jax.Array) -> jax.Array:
    """[..., block size] the slots of `blocks`."""
    return blocks[..., None] * ring.block_size + jnp.arange(ring.block_size)


def _with_block_weights(ring: Ring, blocks: jax.Array, exponent: float | None) -> Ring:
    """`ring` with the weights of `blocks` summed again from its priorities."""
    if exponent is None:
        return ring
    sums = _weights(ring, _block_slots(ring, blocks), exponent).sum(axis=-1)
    return ring._replace(block_weights=ring.block_weights.at[blocks].set(sums))


def n_step_transitions(
    window: types.Trajectory, nstep: replay.NStep
) -> tuple[types.Transition, jax.Array]:
    """The transitions that start at the first W - n + 1 steps of one env's `window` (its
    last n - 1 steps of before, then this rollout's), and [W - n + 1] bool: which are real
    (a step that only reset the env starts none).

    `window` has [W] steps and [W + 1] observations (observation[t + 1] followed step t).
    """
    n, gamma = nstep.n, nstep.discount
    starts = window.reward.shape[0] - n + 1
    steps = jnp.arange(starts)[:, None] + jnp.arange(n)[None, :]  # [starts, n]
    ended = window.terminated | window.truncated
    # Step s + k is in the transition when no step before it (from s on) ended the episode.
    ended_before = jnp.cumsum(ended[steps], axis=1) - ended[steps]
    inside = ended_before == 0
    count = inside.sum(axis=1)  # K: n, or the steps up to the episode's end
    last = jnp.arange(starts) + count - 1
    powers = gamma ** jnp.arange(n, dtype=jnp.float32)
    reward = (window.reward[steps] * powers * inside).sum(axis=1)
    discount = jnp.where(window.terminated[last], 0.0, gamma ** count.astype(jnp.float32))
    transitions = types.Transition(
        observation=window.observation[:starts],
        action=window.action[:starts],
        reward=reward.astype(jnp.float32),
        discount=discount.astype(jnp.float32),
        next_observation=window.observation[last + 1],
    )
    return transitions, window.valid[:starts]


def insert(
    ring: Ring,
    items: types.Transition,
    real: jax.Array,
    priority: float,
    exponent: float | None,
) -> Ring:
    """`ring` with the real ones of `items` ([m] leaves) written after its newest, FIFO;
    `exponent` is the table's priority exponent (None: a uniform table)."""
    capacity = ring.capacity
    offsets = jnp.cumsum(real) - 1
    # Unreal rows go to an index past the end, which the scatter drops.
    slots = jnp.where(real, (ring.head + offsets) % capacity, capacity)
    written = jax.tree.map(
        lambda ring_leaf, new: ring_leaf.at[slots].set(new, mode="drop"), ring.items, items
    )
    priorities = ring.priorities.at[slots].set(priority, mode="drop")
    added = real.sum().astype(jnp.int32)
    ring = Ring(
        written,
        priorities,
        ring.block_weights,
        (ring.head + added) % capacity,
        jnp.minimum(ring.size + added, capacity),
    )
    # Once per rollout, every block: simpler than tracking which ones the inserts reached.
    return _with_block_weights(ring, jnp.arange(ring.block_weights.shape[0]), exponent)


def sample(
    ring: Ring, key: jax.Array, rows: int, exponent: float | None
) -> tuple[jax.Array, Any, jax.Array]:
    """(indices [rows], items, probabilities [rows]) of this device's share of a batch;
    call inside the pmapped loop (the probabilities count every device's draws)."""
    if exponent is None:
        indices = jax.random.randint(key, (rows,), 0, jnp.maximum(ring.size, 1))
        probability = jnp.full(rows, 1.0 / jnp.maximum(ring.size, 1).astype(jnp.float32))
    else:
        block_key, slot_key = jax.random.split(key)
        blocks = _draw(ring.block_weights, block_key, rows)
        weights = _weights(ring, _block_slots(ring, blocks), exponent)  # [rows, block size]
        slots = jax.vmap(_draw, in_axes=(0, 0, None))(
            weights, jax.random.split(slot_key, rows), None
        )
        indices = blocks * ring.block_size + slots
        total = jnp.maximum(ring.block_weights.sum(), 1e-30)
        probability = jnp.take_along_axis(weights, slots[:, None], axis=1)[:, 0] / total
    items = jax.tree.map(lambda leaf: leaf[indices], ring.items)
    return indices, items, probability / parallel.step_device_count()


def _draw(weights: jax.Array, key: jax.Array, rows: int | None) -> jax.Array:
    """Indices into `weights` ([n]), drawn in proportion to them: [rows], or [] for None.
    A zero weight is never drawn while any is positive."""
    cumulative = jnp.cumsum(weights)
    total = cumulative[-1]
    shape = () if rows is None else (rows,)
    # Below the total even where rounding lifts uniform * total onto it.
    target = jnp.minimum(jax.random.uniform(key, shape) * total, jnp.nextafter(total, 0.0))
    index = jnp.searchsorted(cumulative, target, side="right")
    return jnp.minimum(index, weights.shape[0] - 1).astype(jnp.int32)


def set_priorities(
    ring: Ring, indices: jax.Array, priorities: jax.Array, exponent: float | None
) -> Ring:
    """`ring` with new priorities for the sampled `indices`; NaN ones (a skipped update)
    keep the old."""
    new = jnp.where(jnp.isnan(priorities), ring.priorities[indices], priorities)
    ring = ring._replace(priorities=ring.priorities.at[indices].set(new.astype(jnp.float32)))
    return _with_block_weights(ring, indices // ring.block_size, exponent)
