"""n-step accumulation against hand computations, including episode ends and truncation;
a writer following a replay node that moved."""

import numpy as np
import pytest

from gorila_jax import replay
from tests.backends import needs_reverb

GAMMA = 0.5


def _step(acc, obs, action, reward, terminated, truncated, next_obs, valid):
    as_array = lambda x, dtype: np.asarray(x, dtype)  # noqa: E731
    return acc.add(
        as_array(obs, np.float32)[:, None],
        as_array(action, np.int32),
        as_array(reward, np.float32),
        as_array(terminated, bool),
        as_array(truncated, bool),
        as_array(next_obs, np.float32)[:, None],
        as_array(valid, bool),
    )


def _rows(transitions):
    """(obs, action, reward, discount, next_obs) tuples, for order-free comparison."""
    if transitions is None:
        return []
    return [
        (float(o[0]), int(a), float(r), float(d), float(n[0]))
        for o, a, r, d, n in zip(*transitions)
    ]


def test_three_step_returns_termination_truncation_and_resets():
    # env 0: observations 0,1,2,3 with rewards 1,2,3,4, terminated after the 4th step
    #        (final observation 4); its 5th step is envpool's reset step (invalid).
    # env 1: observations 10,11 with rewards 10,20, truncated after the 2nd step
    #        (final observation 12); its 3rd step is the reset step; then 20 -> 21.
    acc = replay.NStepAccumulator(num_envs=2, n=3, discount=GAMMA)
    out = [
        _step(acc, [0, 10], [0, 1], [1, 10], [0, 0], [0, 0], [1, 11], [1, 1]),
        _step(acc, [1, 11], [1, 0], [2, 20], [0, 0], [0, 1], [2, 12], [1, 1]),
        _step(acc, [2, 12], [0, 1], [3, 99], [0, 0], [0, 0], [3, 20], [1, 0]),
        _step(acc, [3, 20], [1, 1], [4, 5], [1, 0], [0, 0], [4, 21], [1, 1]),
        _step(acc, [4, 21], [0, 0], [99, 6], [0, 0], [0, 0], [30, 22], [0, 1]),
    ]
    assert _rows(out[0]) == []
    # Truncation: both held steps leave with bootstrap discounts gamma**2 and gamma.
    assert sorted(_rows(out[1])) == [(10, 1, 10 + GAMMA * 20, GAMMA**2, 12), (11, 0, 20, GAMMA, 12)]
    # env 0 has 3 steps: the oldest leaves with a full 3-step return; the reset step of
    # env 1 (reward 99) is ignored.
    assert _rows(out[2]) == [(0, 0, 1 + GAMMA * 2 + GAMMA**2 * 3, GAMMA**3, 3)]
    # Termination: every held step leaves with discount 0 (no bootstrap).
    assert sorted(_rows(out[3])) == [
        (1, 1, 2 + GAMMA * 3 + GAMMA**2 * 4, 0.0, 4),
        (2, 0, 3 + GAMMA * 4, 0.0, 4),
        (3, 1, 4, 0.0, 4),
    ]
    # env 0's reset step yields nothing; env 1's new episode is only 2 steps long.
    assert _rows(out[4]) == []
    # Its next step completes a 3-step transition from observation 20.
    nxt = _step(acc, [30, 22], [0, 0], [1, 7], [0, 0], [0, 0], [31, 23], [1, 1])
    assert _rows(nxt) == [(20, 1, 5 + GAMMA * 6 + GAMMA**2 * 7, GAMMA**3, 23)]


def test_one_step_transitions_leave_at_once():
    acc = replay.NStepAccumulator(num_envs=1, n=1, discount=0.9)
    assert _rows(_step(acc, [0], [1], [2], [0], [0], [1], [1])) == [
        (0, 1, 2, pytest.approx(0.9), 1)
    ]
    assert _rows(_step(acc, [1], [0], [3], [1], [0], [2], [1])) == [(1, 0, 3, 0.0, 2)]


@pytest.mark.parametrize("n, discount", [(0, 0.9), (3, 1.5)])
def test_bad_settings_are_rejected(n, discount):
    with pytest.raises(ValueError):
        replay.NStepAccumulator(num_envs=1, n=n, discount=discount)


def test_vectorized_matches_a_per_env_reference():
    """Random episodes in 5 envs: the ring-buffer result equals a plain per-env loop."""
    rng = np.random.default_rng(7)
    num_envs, n, gamma, steps = 5, 3, 0.9, 200
    acc = replay.NStepAccumulator(num_envs, n, gamma)
    held = [[] for _ in range(num_envs)]
    expected, got = [], []
    obs = rng.normal(size=num_envs).astype(np.float32)
    valid = np.ones(num_envs, bool)
    for _ in range(steps):
        action = rng.integers(0, 4, num_envs)
        reward = rng.normal(size=num_envs).astype(np.float32)
        terminated = rng.random(num_envs) < 0.05
        truncated = ~terminated & (rng.random(num_envs) < 0.05)
        next_obs = rng.normal(size=num_envs).astype(np.float32)
        got += _rows(_step(acc, obs, action, reward, terminated, truncated, next_obs, valid))
        for e in np.flatnonzero(valid):
            held[e].append((obs[e], action[e], reward[e]))
            ended = terminated[e] or truncated[e]
            while held[e] and (ended or len(held[e]) == n):
                rewards = [r for _, _, r in held[e]]
                ret = sum(gamma**k * r for k, r in enumerate(rewards))
                disc = 0.0 if terminated[e] else gamma ** len(rewards)
                o, a, _ = held[e].pop(0)
                expected.append((float(o), int(a), ret, disc, float(next_obs[e])))
                if not ended:
                    break
        valid = ~(valid & (terminated | truncated))
        obs = next_obs
    assert len(got) == len(expected) > 100
    # float32 returns of rewards that nearly cancel: an absolute bound of a few float32
    # ulps of the rewards (numpy 2 keeps Python floats times float32 in float32).
    np.testing.assert_allclose(sorted(got), sorted(expected), rtol=1e-5, atol=1e-6)


class _MovingReplayNode:
    """A replay node's program client whose server address the test moves."""

    def __init__(self, address: str):
        self.current = address

    def address(self) -> str:
        return self.current


@needs_reverb
def test_a_writer_follows_a_replay_node_restarted_at_another_address():
    # The native replay's writer reaches its node through the program's client, which
    # follows a restart itself (`RayClient`); Reverb's writer dials the server's address.
    import reverb  # the DeepMind set's only

    codec = replay.ItemCodec(np.zeros(4, np.float32))

    def server():
        limiter = replay.RateLimit(1)
        table = replay.uniform_table("t", 1000, limiter, codec.num_bytes)
        return reverb.Server([replay.reverb_table(table)])

    old, new = server(), server()
    node = _MovingReplayNode(f"localhost:{old.port}")
    writer = replay.TransitionWriter(
        replay.ReplayClient(node), "t", max_pending=4, probe_after_s=0.5
    )
    items = codec.encode(np.ones((4, 4), np.float32))
    try:
        writer.write(items, np.ones(4))
        writer.flush()
        old.stop()  # the old replay process is gone; its replacement serves elsewhere
        node.current = f"localhost:{new.port}"
        writer.write(items, np.ones(4))  # unconfirmed when the server went away: lost
        writer.flush()
        writer.write(items, np.ones(4))
        writer.flush()
        size = reverb.Client(node.current).server_info()["t"].current_size
        assert size + writer.items_lost == 8 and size >= 4
    finally:
        writer.close()
        new.stop()
