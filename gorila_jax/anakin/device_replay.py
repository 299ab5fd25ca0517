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
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from gorila_jax import parallel, replay, types


class Ring(NamedTuple):
    """One device's items.

    Attributes:
      items: `types.Transition` with [capacity, ...] leaves.
      priorities: [capacity] float32 (0 where empty).
      head: [] int32, the slot the next item goes to.
      size: [] int32, the items held.
    """

    items: types.Transition
    priorities: jax.Array
    head: jax.Array
    size: jax.Array


def empty(example: types.Transition, capacity: int) -> Ring:
    """A ring of `capacity` items shaped as `example` (one item, no batch axis)."""
    items = jax.tree.map(
        lambda x: jnp.zeros((capacity, *jnp.shape(x)), jnp.asarray(x).dtype), example
    )
    return Ring(
        items, jnp.zeros(capacity, jnp.float32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)
    )


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


def insert(ring: Ring, items: types.Transition, real: jax.Array, priority: float) -> Ring:
    """`ring` with the real ones of `items` ([m] leaves) written after its newest, FIFO."""
    capacity = ring.priorities.shape[0]
    offsets = jnp.cumsum(real) - 1
    # Unreal rows go to an index past the end, which the scatter drops.
    slots = jnp.where(real, (ring.head + offsets) % capacity, capacity)
    written = jax.tree.map(
        lambda ring_leaf, new: ring_leaf.at[slots].set(new, mode="drop"), ring.items, items
    )
    priorities = ring.priorities.at[slots].set(priority, mode="drop")
    added = real.sum().astype(jnp.int32)
    return Ring(
        written,
        priorities,
        (ring.head + added) % capacity,
        jnp.minimum(ring.size + added, capacity),
    )


def sample(
    ring: Ring, key: jax.Array, rows: int, exponent: float | None
) -> tuple[jax.Array, Any, jax.Array]:
    """(indices [rows], items, probabilities [rows]) of this device's share of a batch;
    call inside the pmapped loop (the probabilities count every device's draws)."""
    capacity = ring.priorities.shape[0]
    held = jnp.arange(capacity) < ring.size
    if exponent is None:
        weights = held.astype(jnp.float32)
    else:
        weights = jnp.where(held, ring.priorities**exponent, 0.0)
    probabilities = weights / jnp.maximum(weights.sum(), 1e-30)
    indices = jax.random.choice(key, capacity, (rows,), p=probabilities)
    items = jax.tree.map(lambda leaf: leaf[indices], ring.items)
    return indices, items, probabilities[indices] / parallel.step_device_count()


def set_priorities(ring: Ring, indices: jax.Array, priorities: jax.Array) -> Ring:
    """`ring` with new priorities for the sampled `indices`; NaN ones (a skipped update)
    keep the old."""
    new = jnp.where(jnp.isnan(priorities), ring.priorities[indices], priorities)
    return ring._replace(priorities=ring.priorities.at[indices].set(new.astype(jnp.float32)))
