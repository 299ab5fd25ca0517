"""An Anakin learner's replay on the device: the same transitions as the actors' n-step
adder, FIFO, sampled by priority, priorities updated (NaN kept)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gorila_jax import types
from gorila_jax.anakin import device_replay
from gorila_jax import replay


def _episodes(rng, envs: int, steps: int):
    """Random steps of `envs` envs under envpool's rule: a step after an end only resets."""
    obs = rng.normal(size=(steps + 1, envs, 3)).astype(np.float32)
    obs[..., 0] = np.arange(steps + 1)[:, None]  # the step, to tell transitions apart
    action = rng.integers(0, 4, size=(steps, envs)).astype(np.int32)
    reward = rng.normal(size=(steps, envs)).astype(np.float32)
    ends = rng.random((steps, envs)) < 0.15
    terminated = ends & (rng.random((steps, envs)) < 0.5)
    truncated = ends & ~terminated
    valid = np.ones((steps, envs), bool)
    valid[1:] = ~ends[:-1]
    terminated &= valid
    truncated &= valid
    reward = np.where(valid, reward, 0.0).astype(np.float32)
    return obs, action, reward, terminated, truncated, valid


def _as_rows(transitions) -> set:
    return {
        tuple(np.round(np.concatenate([np.ravel(np.asarray(x)[i]) for x in transitions]), 4))
        for i in range(len(transitions.reward))
    }


@pytest.mark.parametrize("n", [1, 3])
def test_its_transitions_are_the_n_step_adders(n):
    rng = np.random.default_rng(n)
    envs, length, rollouts = 3, 7, 5
    nstep = replay.NStep(n, 0.9)
    obs, action, reward, terminated, truncated, valid = _episodes(rng, envs, length * rollouts)
    accumulator = replay.NStepAccumulator(envs, n, nstep.discount)
    expected = set()
    for t in range(length * rollouts):
        out = accumulator.add(
            obs[t], action[t], reward[t], terminated[t], truncated[t], obs[t + 1], valid[t]
        )
        if out is not None:
            expected |= _as_rows(out)
    # Starts in the last n - 1 steps are complete on the device only after a later rollout
    # (the adder emits those of an episode that ended in them at once).
    last_start = length * rollouts - n
    expected = {row for row in expected if row[0] <= last_start}
    # The device side: each rollout's [T] steps after the n - 1 kept from before.
    got = set()
    held = n - 1
    tail = None
    for r in range(rollouts):
        span = slice(r * length, (r + 1) * length)
        steps = [
            obs[span],
            action[span],
            reward[span],
            terminated[span],
            truncated[span],
            valid[span],
        ]
        if tail is None:
            tail = [np.zeros((held, *x.shape[1:]), x.dtype) for x in steps]
        window = [np.concatenate([a, b]) for a, b in zip(tail, steps)]
        tail = [x[length : length + held] for x in window]
        observation = np.concatenate([window[0], obs[(r + 1) * length][None]])
        for env in range(envs):
            trajectory = types.Trajectory(
                observation[:, env], *(x[:, env] for x in window[1:]), None, None, None
            )
            items, real = device_replay.n_step_transitions(trajectory, nstep)
            real = np.asarray(real)
            got |= _as_rows(jax.tree.map(lambda x, real=real: np.asarray(x)[real], items))
    assert got == expected and len(got) > length * rollouts


def _ring(capacity=4):
    example = types.Transition(
        jnp.zeros(2), jnp.int32(0), jnp.float32(0), jnp.float32(0), jnp.zeros(2)
    )
    return device_replay.empty(example, capacity)


def _items(rewards):
    m = len(rewards)
    return types.Transition(
        jnp.zeros((m, 2)), jnp.zeros(m, jnp.int32), jnp.asarray(rewards, jnp.float32),
        jnp.ones(m), jnp.zeros((m, 2)),
    )  # fmt: skip


def _sample(ring, rows, exponent):
    # `sample` counts the devices of the pmapped loop it runs in: here, one.
    run = jax.pmap(lambda key: device_replay.sample(ring, key, rows, exponent), axis_name="data")
    indices, items, probabilities = run(jax.random.PRNGKey(0)[None])
    return np.asarray(indices[0]), items, np.asarray(probabilities[0])


def test_only_real_items_go_in_and_the_oldest_leave_first():
    ring = device_replay.insert(
        _ring(), _items([1, 2, 3]), jnp.array([True, False, True]), 1.0, None
    )
    assert int(ring.size) == 2 and list(np.asarray(ring.items.reward[:2])) == [1, 3]
    ring = device_replay.insert(ring, _items([4, 5, 6]), jnp.ones(3, bool), 1.0, None)
    # Capacity 4: the oldest (1) was overwritten by the newest (6).
    assert int(ring.size) == 4 and sorted(np.asarray(ring.items.reward)) == [3, 4, 5, 6]


def test_priorities_decide_sampling_and_a_nan_keeps_the_old_one():
    ring = device_replay.insert(_ring(), _items([1, 2, 3, 4]), jnp.ones(4, bool), 1.0, 1.0)
    ring = device_replay.set_priorities(
        ring, jnp.array([0, 1, 2]), jnp.array([0.0, 0.0, jnp.nan]), 1.0
    )
    assert list(np.asarray(ring.priorities)) == [0.0, 0.0, 1.0, 1.0]
    indices, _, probabilities = _sample(ring, 256, exponent=1.0)
    assert set(indices) == {2, 3} and np.allclose(probabilities, 0.5)
    # Uniform tables ignore priorities: every held item alike.
    indices, _, probabilities = _sample(ring, 256, exponent=None)
    assert set(indices) == {0, 1, 2, 3} and np.allclose(probabilities, 0.25)


def test_prioritized_draws_follow_priority_to_the_exponent_across_blocks():
    # 70 slots: blocks of 8 and a padded last one; 61 held, one item drawn twice in the
    # update (a batch samples with replacement), priorities spread over 3 orders.
    exponent, capacity, rows = 0.6, 70, 20_000
    ring = device_replay.insert(
        _ring(capacity), _items(np.arange(61)), jnp.ones(61, bool), 1.0, exponent
    )
    updated = jnp.array([0, 5, 5, 17, 40, 60])
    ring = device_replay.set_priorities(
        ring, updated, jnp.array([100.0, 0.0, 0.0, 0.01, 30.0, 2.0]), exponent
    )
    priorities = np.ones(61)
    priorities[[0, 5, 17, 40, 60]] = [100.0, 0.0, 0.01, 30.0, 2.0]
    expected = priorities**exponent / (priorities**exponent).sum()
    indices, items, probabilities = _sample(ring, rows, exponent)
    assert indices.max() < 61 and 5 not in indices  # nothing empty, nothing of weight 0
    assert np.array_equal(np.asarray(items.reward[0]), indices.astype(np.float32))
    np.testing.assert_allclose(probabilities, expected[indices], rtol=1e-5)
    frequencies = np.bincount(indices, minlength=61) / rows
    # Within 5 standard errors of each slot's probability.
    tolerance = 5 * np.sqrt(expected * (1 - expected) / rows) + 1e-9
    assert np.all(np.abs(frequencies - expected) <= tolerance)
