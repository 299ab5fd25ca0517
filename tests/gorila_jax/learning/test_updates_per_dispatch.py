"""Several updates in one device call (`updates_per_dispatch`): the same learning as one call
per update, on the learner node with a real Reverb replay, and refused where it cannot run."""

import dataclasses

import chex
import jax
import numpy as np
import pytest

from agents import dqn, sac
from gorila_jax import envs, parallel
from gorila_jax.distributed import launchers
from gorila_jax.gorila import mode
from gorila_jax.learning import step as step_lib
from gorila_jax.run import experiment, wiring
from tests import fakes
from tests.agents.dqn.test_learning import SPEC, TINY, _random_batch
from tests.gorila_jax.acting import test_nodes
from tests.backends import first_batch

UPDATES = 4


def _state_and_guard(builder, devices):
    state = builder.init_train_state(jax.random.PRNGKey(0), SPEC)
    return parallel.replicate(state, devices), parallel.replicate(step_lib.init_guard(), devices)


def _one_call_per_update(builder, batches, devices):
    step = parallel.pmap_step(step_lib.make_step(builder, SPEC), devices, step_lib.OUT_AXES)
    state, guard = _state_and_guard(builder, devices)
    priorities = []
    for batch in batches:
        state, guard, info, published = step(state, guard, parallel.shard(batch, len(devices)))
        priorities.append(np.asarray(info.priorities))  # [D, B/D]
    # Per device, update i's rows follow update i - 1's: the learner's sampled row order.
    return state, published, np.concatenate(priorities, axis=1)


def _one_call(builder, batches, devices):
    step = parallel.pmap_step(
        step_lib.make_step(builder, SPEC, updates=len(batches)), devices, step_lib.OUT_AXES
    )
    state, guard = _state_and_guard(builder, devices)
    per_device = [parallel.shard(batch, len(devices)) for batch in batches]
    rows = jax.tree.map(lambda *parts: np.concatenate(parts, axis=1), *per_device)
    state, guard, info, published = step(state, guard, rows)
    assert int(np.asarray(info.metrics["nonfinite_skipped_steps"])[0]) == 0
    return state, published, np.asarray(info.priorities)


@pytest.mark.parametrize("num_devices", [1, 4])
def test_updates_in_one_call_learn_what_one_call_per_update_learns(num_devices):
    # target_update_period=2 copies the target inside the call: the scan must carry it.
    builder = dqn.DQNBuilder(TINY)
    batches = [_random_batch(seed) for seed in range(UPDATES)]
    devices = jax.devices()[:num_devices]
    apart, apart_params, apart_priorities = _one_call_per_update(builder, batches, devices)
    together, together_params, together_priorities = _one_call(builder, batches, devices)
    chex.assert_trees_all_close(
        parallel.unreplicate(together), parallel.unreplicate(apart), atol=1e-5
    )
    chex.assert_trees_all_close(together_params, apart_params, atol=1e-5)
    assert int(parallel.unreplicate(together).step) == UPDATES
    np.testing.assert_allclose(together_priorities, apart_priorities, atol=1e-5)


def test_learner_node_takes_the_updates_of_one_call_and_writes_their_priorities():
    config = dataclasses.replace(test_nodes.CONFIG, updates_per_dispatch=UPDATES)
    with launchers.launch(test_nodes._program(actor_steps=0, config=config), "local") as running:
        replay_client, learner_client = running.client("replay"), running.client("learner")
        table = dqn.builder.TABLE
        assert fakes.wait_until(lambda: replay_client.table_info()[table]["size"] >= 200, 120)
        calls = 0
        while calls < 3:
            calls += learner_client.step()
        assert learner_client.get_params()[0] == 3 * UPDATES  # the version counts updates
        assert learner_client.last_batch_size() == config.batch_size
        learner_client.close()  # drains queued priority updates
        # Each call sampled the rows of all its updates at once, and their priorities went back.
        assert replay_client.table_info()[table]["samples"] >= 3 * UPDATES * config.batch_size
        probabilities = first_batch(replay_client, table, 64).probabilities
        assert np.ptp(probabilities) > 0, "priorities still all equal after the updates"


def test_gorila_mode_refuses_several_updates_per_call():
    builder = dqn.DQNBuilder(dataclasses.replace(TINY, updates_per_dispatch=2))
    with pytest.raises(ValueError, match="updates_per_dispatch=2 runs on the one-host"):
        mode.check_agent(builder, SPEC)


def test_multihost_learner_refuses_several_updates_per_call(tmp_path):
    builder = sac.SACBuilder(dataclasses.replace(sac.SACConfig(), updates_per_dispatch=2))
    cfg = experiment.ExperimentConfig(
        env_id="Pendulum-v1", num_learner_hosts=2, logdir=str(tmp_path), launcher="ray"
    )
    with pytest.raises(ValueError, match="updates_per_dispatch=2 runs on a one-host learner"):
        wiring.make_program(builder, cfg, envs.env_spec("Pendulum-v1"), None)


def test_updates_per_dispatch_must_be_positive():
    with pytest.raises(ValueError, match="updates_per_dispatch"):
        dataclasses.replace(TINY, updates_per_dispatch=0).validate(1)
