"""Multi-host learners over loopback: 2 jax.distributed processes x 2 CPU devices (gloo)
give the same DQN update as one process with 4 devices on the same global batch, and
a checkpoint that the chief alone saves restores bit for bit in both processes.

The file is also the child program: `python -m tests.gorila_jax.distributed.test_multihost
--process_id=...` is one learner process of the job the test starts.
"""

import argparse
import dataclasses
import functools
import os
import subprocess
import sys
import time

import chex
import jax
import numpy as np
import pytest

from agents import dqn
from gorila_jax import builder as builder_lib
from gorila_jax import envs, parallel, types
from gorila_jax.distributed import multihost
from gorila_jax.learning import checkpoint, multihost_learner
from gorila_jax.learning import step as step_lib

from tests import REPO

ENV_ID = "CartPole-v1"
SEED = 5
NUM_PROCESSES = 2
DEVICES_PER_PROCESS = 2
NUM_UPDATES = 3
CONFIG = dataclasses.replace(
    dqn.DQNConfig(),
    hidden_sizes=(32, 32),
    batch_size=64,
    learning_rate=1e-3,
    target_update_period=2,  # a target copy happens within the compared updates
    importance_exponent_anneal_steps=100,
)


def _cartpole_batches(seed: int, num_batches: int, size: int) -> list[builder_lib.SampledBatch]:
    """Real CartPole transitions from random actions, with made-up PER probabilities."""
    rng = np.random.default_rng(seed)
    env = envs.make_env(ENV_ID, num_envs=8, seed=seed)
    obs, _ = env.reset()
    rows = []
    while len(rows) < num_batches * size:
        action = rng.integers(0, 2, 8).astype(np.int32)
        next_obs, reward, terminated, _, _ = env.step(action)
        for i in range(8):
            discount = 0.0 if terminated[i] else CONFIG.discount
            rows.append((obs[i], action[i], reward[i], discount, next_obs[i]))
        obs = next_obs
    env.close()
    batches = []
    for b in range(num_batches):
        chunk = rows[b * size : (b + 1) * size]
        data = types.Transition(*(np.asarray(column) for column in zip(*chunk)))
        data = data._replace(
            reward=data.reward.astype(np.float32), discount=data.discount.astype(np.float32)
        )
        probabilities = rng.uniform(0.5, 2.0, size) / (size * 10)
        batches.append(
            builder_lib.SampledBatch(data, probabilities, np.full(size, size * 10, np.int64))
        )
    return batches


def _save(path: str, trees: dict) -> None:
    np.savez(
        path,
        **{
            f"{name}/{i}": np.asarray(leaf)
            for name, tree in trees.items()
            for i, leaf in enumerate(jax.tree.leaves(tree))
        },
    )


def _load(path: str, name: str, like) -> object:
    with np.load(path) as saved:
        leaves = [saved[f"{name}/{i}"] for i in range(len(jax.tree.leaves(like)))]
    return jax.tree.unflatten(jax.tree.structure(like), leaves)


def _child_main(argv: list[str]) -> None:
    """One learner process: join, agree on the state, update, vote to stop, report."""
    parser = argparse.ArgumentParser()
    for name in ("coordinator", "batches", "out", "checkpoints"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--process_id", type=int, required=True)
    args = parser.parse_args(argv)
    group = multihost.ProcessGroup(args.coordinator, NUM_PROCESSES, args.process_id)
    _stage(f"process {args.process_id} imported; joining {args.coordinator}")
    multihost.initialize(group, timeout_s=300)
    _stage("joined")
    spec = envs.env_spec(ENV_ID)
    builder = dqn.DQNBuilder(CONFIG)
    # Process 1 starts from another seed: the broadcast must replace its state with the chief's.
    state = builder_lib.initial_train_state(builder, spec, SEED + args.process_id)
    state = multihost.broadcast_from_chief(jax.device_get(state))
    step = multihost_learner.make_global_step(builder, spec)
    local = jax.local_devices()
    state_repl = parallel.replicate(state, local)
    guard = parallel.replicate(step_lib.init_guard(), local)
    batches = [_load(args.batches, f"batch{k}", BATCH_STRUCTURE) for k in range(NUM_UPDATES + 1)]
    priorities, stops = [], []
    _stage("state agreed; updating")
    for batch in batches[:NUM_UPDATES]:
        mine = multihost.process_rows(batch, args.process_id, NUM_PROCESSES)
        sharded = parallel.shard_to_devices(mine, local)
        (state_repl, guard), info, published, stop = step(
            (state_repl, guard), sharded, multihost.stop_votes(False)
        )
        priorities.append(parallel.unshard(info.priorities))
        stops.append(bool(stop))
    trained = jax.device_get(parallel.unreplicate(state_repl))
    # Process 1 alone is told to stop; the chief must learn it from the same step.
    last = multihost.process_rows(batches[-1], args.process_id, NUM_PROCESSES)
    (state_repl, guard), _, _, stop = step(
        (state_repl, guard),
        parallel.shard_to_devices(last, local),
        multihost.stop_votes(args.process_id == 1),
    )
    after_stop = jax.device_get(parallel.unreplicate(state_repl))
    restored, restored_step = _save_on_chief_and_restore(args, builder, spec, trained)
    _save(
        args.out,
        {
            "trained": trained,
            "after_stop": after_stop,
            "restored": restored,
            "restored_step": np.asarray(restored_step),
            "published": jax.device_get(published),
            "priorities": priorities,
            "counts": np.array([jax.device_count(), jax.local_device_count()]),
            "flags": np.array(stops + [bool(stop), multihost.is_chief()]),
        },
    )
    _stage("saved")
    multihost.shutdown()


def _save_on_chief_and_restore(args, builder, spec, trained) -> tuple:
    """The chief saves `trained` (as learner/0 checkpoints, inside the jax.distributed
    job, with no other process taking part); then, as a restarted group does, every
    process starts from a fresh state of its own and takes the chief's restored one."""
    if multihost.is_chief():
        saver = checkpoint.LearnerCheckpoints(args.checkpoints, max_to_keep=2)
        saver.save(NUM_UPDATES, trained, {"learner_steps": NUM_UPDATES})
    _stage("checkpoint saved by the chief")
    state = jax.device_get(
        builder_lib.initial_train_state(builder, spec, SEED + 10 + args.process_id)
    )
    step = -1
    if multihost.is_chief():
        reader = checkpoint.LearnerCheckpoints(args.checkpoints, read_only=True)
        step, state, _ = reader.restore_newest(state, "learner/0")
    return multihost.broadcast_from_chief((state, np.asarray(step, np.int32)))


def _stage(message: str) -> None:
    """Progress on the child's output, which the test shows if the job fails or hangs."""
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


# The structure of a saved batch, to unflatten it (the leaves are placeholders).
BATCH_STRUCTURE = builder_lib.SampledBatch(types.Transition(0, 0, 0, 0, 0), 0, 0)


def _single_process_update(batches, spec):
    """The reference: one process, 4 devices, the whole global batch each step."""
    builder = dqn.DQNBuilder(CONFIG)
    devices = jax.devices()[: NUM_PROCESSES * DEVICES_PER_PROCESS]
    step = parallel.pmap_step(step_lib.make_step(builder, spec), devices, step_lib.OUT_AXES)
    state = parallel.replicate(builder_lib.initial_train_state(builder, spec, SEED), devices)
    guard = parallel.replicate(step_lib.init_guard(), devices)
    priorities = []
    for batch in batches:
        state, guard, info, published = step(state, guard, parallel.shard(batch, len(devices)))
        priorities.append(np.asarray(parallel.unshard(info.priorities)))
    return jax.device_get(parallel.unreplicate(state)), jax.device_get(published), priorities


def run_processes(module: str, args_of, timeout_s: float) -> None:
    """Runs `python -m module *args_of(i)` for i < NUM_PROCESSES, each seeing
    DEVICES_PER_PROCESS CPU devices; fails with the output of any that did not exit 0."""
    env = multihost.cpu_device_env(DEVICES_PER_PROCESS)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    children = [
        subprocess.Popen(
            [sys.executable, "-m", module, *args_of(i)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(NUM_PROCESSES)
    ]
    outputs: dict[int, str] = {}
    try:
        for i, child in enumerate(children):  # a liveness bound, generous for a loaded machine
            outputs[i] = child.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        pass  # reported below with what each process printed: a hang or just slowness
    finally:
        for i, child in enumerate(children):
            child.kill()
            if i not in outputs:
                outputs[i] = child.communicate()[0]
    for i, child in enumerate(children):
        assert child.returncode == 0, f"process {i} exit {child.returncode}:\n{outputs[i][-3000:]}"


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """Runs the 2-process job once: (batches, spec, the processes' result files, the checkpoint
    directory the chief saved in)."""
    tmp = tmp_path_factory.mktemp("multihost")
    spec = envs.env_spec(ENV_ID)
    batches = _cartpole_batches(SEED, NUM_UPDATES + 1, CONFIG.batch_size)
    batches_path = str(tmp / "batches.npz")
    _save(batches_path, {f"batch{k}": batch for k, batch in enumerate(batches)})
    coordinator = multihost.free_coordinator_address("127.0.0.1")
    outs = [str(tmp / f"process{i}.npz") for i in range(NUM_PROCESSES)]
    run_processes(
        "tests.gorila_jax.distributed.test_multihost",
        lambda i: [
            f"--process_id={i}",
            f"--coordinator={coordinator}",
            f"--batches={batches_path}",
            f"--out={outs[i]}",
            f"--checkpoints={tmp / 'checkpoints'}",
        ],
        timeout_s=800,
    )
    return batches, spec, outs, str(tmp / "checkpoints")


def test_each_process_sees_every_device_and_only_process_0_is_chief(two_process_run):
    outs = two_process_run[2]
    for process_id, out in enumerate(outs):
        with np.load(out) as saved:
            global_count, local_count = saved["counts/0"]
            is_chief = bool(saved["flags/0"][NUM_UPDATES + 1])
        assert (global_count, local_count) == (4, DEVICES_PER_PROCESS)
        assert is_chief == (process_id == 0)


@pytest.fixture(scope="module")
def single_process_result(two_process_run):
    batches, spec = two_process_run[:2]
    return _single_process_update(batches[:NUM_UPDATES], spec)


def test_two_process_update_equals_single_process_four_device_update(
    two_process_run, single_process_result
):
    outs = two_process_run[2]
    reference, reference_published, _ = single_process_result
    for out in outs:
        trained = _load(out, "trained", reference)
        # Process 1 began from another seed: equal parameters also prove the broadcast.
        chex.assert_trees_all_close(trained.params, reference.params, atol=1e-6, rtol=1e-5)
        chex.assert_trees_all_close(trained.target_params, reference.target_params, atol=1e-6)
        chex.assert_trees_all_close(trained.opt_state, reference.opt_state, atol=1e-6, rtol=1e-5)
        assert int(trained.step) == NUM_UPDATES
        published = _load(out, "published", reference_published)
        chex.assert_trees_all_close(published, reference_published, atol=1e-6, rtol=1e-5)


def test_each_process_gets_the_priorities_of_exactly_the_rows_it_sampled(
    two_process_run, single_process_result
):
    outs = two_process_run[2]
    _, _, reference_priorities = single_process_result
    share = CONFIG.batch_size // NUM_PROCESSES
    for process_id, out in enumerate(outs):
        mine = _load(out, "priorities", [np.zeros(0)] * NUM_UPDATES)
        for step, priorities in enumerate(mine):
            rows = slice(process_id * share, (process_id + 1) * share)
            np.testing.assert_allclose(
                priorities, reference_priorities[step][rows], atol=1e-5, rtol=1e-5
            )


def test_a_stop_vote_from_one_process_stops_every_process_without_an_update(
    two_process_run, single_process_result
):
    outs = two_process_run[2]
    reference, _, _ = single_process_result
    for out in outs:
        with np.load(out) as saved:
            stops = saved["flags/0"][: NUM_UPDATES + 1].tolist()
        assert stops == [False] * NUM_UPDATES + [True]  # the chief learnt process 1's vote
        trained = _load(out, "trained", reference)
        after_stop = _load(out, "after_stop", reference)
        chex.assert_trees_all_equal(after_stop, trained)  # the voted step changed nothing


def test_a_checkpoint_saved_by_the_chief_alone_restores_bit_for_bit_in_both_processes(
    two_process_run, single_process_result
):
    outs, checkpoints = two_process_run[2:]
    reference = single_process_result[0]
    assert checkpoint.LearnerCheckpoints(checkpoints, read_only=True).steps() == [NUM_UPDATES]
    for out in outs:
        trained = _load(out, "trained", reference)
        # Each process began the restore from a state of its own seed: equality
        # proves the chief's read and the broadcast, dtypes and bits alike.
        restored = _load(out, "restored", reference)
        jax.tree.map(
            functools.partial(np.testing.assert_array_equal, strict=True), restored, trained
        )
        with np.load(out) as saved:
            assert int(saved["restored_step/0"]) == NUM_UPDATES


def test_process_group_rejects_bad_settings_by_name():
    with pytest.raises(ValueError, match="num_learner_hosts"):
        multihost.ProcessGroup("127.0.0.1:1234", 0, 0)
    with pytest.raises(ValueError, match="process_id=2"):
        multihost.ProcessGroup("127.0.0.1:1234", 2, 2)
    with pytest.raises(ValueError, match="coordinator_address"):
        multihost.ProcessGroup("127.0.0.1", 2, 0)
    assert multihost.ProcessGroup("127.0.0.1:1234", 2, 0).is_chief
    assert not multihost.ProcessGroup("127.0.0.1:1234", 2, 1).is_chief


def test_local_batch_size_splits_evenly_or_names_the_setting():
    assert multihost.local_batch_size(512, num_processes=2, local_device_count=4) == 256
    with pytest.raises(ValueError, match="batch_size=100 must be divisible by the 8"):
        multihost.local_batch_size(100, num_processes=2, local_device_count=4)


def test_cpu_device_env_replaces_the_device_count_and_keeps_other_xla_flags():
    env = multihost.cpu_device_env(
        2, {"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=4", "A": "b"}
    )
    assert env["XLA_FLAGS"].split() == ["--xla_foo=1", "--xla_force_host_platform_device_count=2"]
    assert env["A"] == "b"


def test_free_coordinator_address_gives_a_port_that_can_be_bound():
    import socket

    host, _, port = multihost.free_coordinator_address("127.0.0.1").rpartition(":")
    with socket.socket() as server:
        server.bind((host, int(port)))  # raises if the port were taken


if __name__ == "__main__":
    _child_main(sys.argv[1:])
