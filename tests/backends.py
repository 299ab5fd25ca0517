"""The replay backends this dependency set installs, for tests that run on each.

The default set has only the native replay; the DeepMind set (`DEEPMIND=1 bash
tests/run.sh`) has Reverb as well. A Reverb case is skipped, with the command that
runs it, where Reverb is not installed.
"""

import importlib.util

import pytest

from gorila_jax import replay

_WHERE_REVERB_IS = "the Reverb backend is the DeepMind set's: DEEPMIND=1 bash tests/run.sh"
# `reverb` marks what the DeepMind set's CI step selects (tests/run.sh).
REVERB_MARKS = (
    pytest.mark.reverb,
    pytest.mark.skipif(not replay.installed(replay.REVERB), reason=_WHERE_REVERB_IS),
)

# Parameters for a test of every backend: `@pytest.mark.parametrize("backend", BACKENDS)`.
BACKENDS = [replay.NATIVE, pytest.param(replay.REVERB, marks=REVERB_MARKS)]


def needs_reverb(test):
    """Marks a test of the Reverb backend: skipped where Reverb is not installed."""
    for mark in REVERB_MARKS:
        test = mark(test)
    return test


def import_reverb():
    """`reverb`, or the whole test module skipped (for modules of Reverb-only tests)."""
    return pytest.importorskip("reverb", reason=_WHERE_REVERB_IS)


needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is the default set's (the DeepMind set has none): bash tests/run.sh",
)

# The replay node of this set's default backend (`replay.DEFAULT_BACKEND`): native on the
# default set, Reverb on the DeepMind set; for tests of what any replay node does.
DefaultReplayNode = replay.node_class(replay.DEFAULT_BACKEND)


def sampled_items(node, table: str, count: int, exponent: float = 1.0) -> dict[int, tuple]:
    """key -> (packed item, priority) of `count` rows sampled from `table` of a replay node
    (or its client) of either backend, taking exactly that many (from a queue: the first
    `count`); `exponent`: the table's priority exponent, through which the native node's
    probabilities and mass give the priority."""
    if node.endpoint().backend == replay.NATIVE:
        sample = node.sample(table, count, 60.0)
        priorities = (sample.probabilities * sample.mass) ** (1.0 / exponent)
        return {
            int(key): (row, float(priority))
            for key, row, priority in zip(sample.keys, sample.data, priorities)
        }
    import reverb  # the DeepMind set's only

    items = reverb.Client(node.address()).sample(table, count, emit_timesteps=False)
    return {int(item.info.key): (item.data[0], float(item.info.priority)) for item in items}


def optional_module(name: str):
    """Module `name` (reverb, tensorflow) where this set installs Reverb, else None: for a
    test module whose tests that use it are marked `needs_reverb`."""
    return importlib.import_module(name) if replay.installed(replay.REVERB) else None


def first_batch(node, table: str, batch_size: int, codec=None):
    """One batch of `table` of a replay node (or its client) of either backend, as a
    learner samples it (`replay.ReplayShards.sampler`)."""
    sampler = replay.ReplayShards(node).sampler(table, codec)
    try:
        for _ in range(60):  # each try ends within the rate limiter's timeout
            batch = next(iter(sampler.batches(batch_size)), None)
            if batch is not None:
                return batch
        raise AssertionError(f"no batch of {batch_size} from table {table!r}")
    finally:
        sampler.close()
