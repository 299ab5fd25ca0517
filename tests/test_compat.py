"""`gorila_jax.compat` on this set's JAX (0.11 on the default set, 0.4.34 on the DeepMind
set): the learner's device layout through `gorila_jax.parallel`, on 4 CPU devices."""

import contextlib
import os
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest

from gorila_jax import compat, parallel, xla_cpu


@pytest.fixture
def devices():
    found = jax.local_devices()[:4]
    assert len(found) == 4, "tests/conftest.py asks XLA for 4 host devices"
    return found


@contextlib.contextmanager
def _deprecations_fail():
    """Whatever JAX says is deprecated fails the test: these paths must follow its API."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        yield


def test_the_version_switch_matches_this_jax():
    assert compat.PMAP_ON_SHARD_MAP == (compat.JAX_VERSION >= (0, 8, 0))
    assert compat.JAX_VERSION[:2] == tuple(int(p) for p in jax.__version__.split(".")[:2])


def test_replicated_state_is_one_copy_per_device_and_a_pmapped_step_reads_each(devices):
    state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.int32(7)}
    with _deprecations_fail():
        copies = parallel.replicate(state, devices)
        step = parallel.pmap_step(
            lambda s, b: s["w"].sum() + s["step"] + b.sum(), devices, donate_state=False
        )
        out = np.asarray(step(copies, parallel.shard_to_devices(np.ones(8, np.float32), devices)))
    assert copies["w"].shape == (4, 2, 3)
    held = {shard.device: np.asarray(shard.data) for shard in copies["w"].addressable_shards}
    assert set(held) == set(devices)
    for copy in held.values():
        np.testing.assert_array_equal(copy, state["w"][None])
    np.testing.assert_array_equal(out, np.full(4, 15 + 7 + 2, np.float32))
    # The first copy lives on the first device alone: one-device code can use it with its own.
    first = parallel.unreplicate(copies)
    assert first["w"].devices() == {devices[0]}
    np.testing.assert_array_equal(first["w"] - jax.device_put(state["w"], devices[0]), 0)


def test_a_sharded_batch_puts_each_slice_on_its_device_and_psum_adds_them(devices):
    batch = np.arange(16, dtype=np.float32).reshape(8, 2)
    with _deprecations_fail():
        on_devices = parallel.shard_to_devices(batch, devices)
        total = parallel.pmap_step(
            lambda _, b: parallel.psum(b.sum()), devices, donate_state=False
        )(parallel.replicate(np.float32(0), devices), on_devices)
    for index, device in enumerate(devices):
        (shard,) = [s for s in on_devices.addressable_shards if s.device == device]
        np.testing.assert_array_equal(np.asarray(shard.data)[0], batch[2 * index : 2 * index + 2])
    np.testing.assert_array_equal(np.asarray(total), np.full(4, batch.sum()))


def test_changed_leaves_are_copied_and_unchanged_ones_reused(devices):
    old = {"params": np.ones(3, np.float32), "opt": np.zeros(3, np.float32)}
    copies = parallel.replicate(old, devices)
    new = {**old, "params": np.full(3, 2.0, np.float32)}
    again = parallel.replicate_changed(new, old, copies, devices)
    assert again["opt"] is copies["opt"]
    np.testing.assert_array_equal(np.asarray(again["params"]), np.full((4, 3), 2.0))


def test_this_jax_says_when_its_backends_started_and_whether_its_cpu_pool_can_be_counted(
    devices,
):
    # What `xla_cpu` reads on either set: the summary's worker count and the refusal of a
    # count that came too late both rest on them.
    del devices  # the backends are running
    assert compat.backends_started()
    if compat.JAX_VERSION >= (0, 8, 0):
        assert xla_cpu.worker_threads() >= 1  # named tf_XLAEigen
    else:
        assert xla_cpu.worker_threads() is None  # 0.4.34 names no thread


def test_one_xla_worker_is_started_or_refused_with_the_reason_on_this_jax(one_cpu_device_env):
    program = (
        "from gorila_jax import xla_cpu\n"
        "try:\n"
        "    xla_cpu.limit_worker_threads(1)\n"
        "    print('workers', xla_cpu.worker_threads())\n"
        "except ValueError as error:\n"
        "    print('refused', error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        env=one_cpu_device_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    said = result.stdout.strip().splitlines()[-1]
    if compat.JAX_VERSION >= (0, 8, 0):
        assert said == "workers 1"
    else:
        assert said.startswith("refused") and "does not name XLA:CPU's worker threads" in said
