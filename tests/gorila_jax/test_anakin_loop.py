"""The Anakin device call (`gorila_jax/anakin/loop.py`) as `AnakinNode` builds it
(`node.device_program`)."""

import jax
import numpy as np

from agents import ppo
from gorila_jax import gymnax_envs, parallel
from gorila_jax.anakin import loop, node
from gorila_jax.learning import step as step_lib

ENV = "gymnax/CartPole-v1"
ITERATIONS = 3


def _call_outputs(updates_every_iteration: bool, active: int):
    """One device call of `active` of ITERATIONS iterations on two devices: (state, output)."""
    config = ppo.PPOConfig(
        hidden_sizes=(16, 16),
        trajectory_length=16,
        batch_size=2,
        num_actors=2,
        num_epochs=2,
        num_minibatches=2,
    )
    builder = ppo.PPOBuilder(config)
    spec = gymnax_envs.env_spec(ENV)
    devices = jax.devices()[:2]
    layout = loop.Layout(2, 1, 2, 16)
    learning = node.learning(builder, spec, layout)
    assert learning.updates_every_iteration  # an on-policy agent's: one update an iteration
    learning = learning._replace(updates_every_iteration=updates_every_iteration)
    call, envs, kept = node.device_program(
        builder, spec, layout, learning, ITERATIONS, devices, 0, 0
    )
    state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), spec), devices)
    guard = parallel.replicate(step_lib.init_guard(), devices)
    (state, *_), out = call((state, guard, envs, kept), 0, active)
    return jax.device_get(parallel.unreplicate(state)), jax.device_get(out)


def test_iterations_before_the_last_learn_the_same_without_computing_their_metrics():
    """An on-policy call leaves out the metrics of all but its last active iteration; what it
    learns, and the metrics it reports, are those of the call that computes every one."""
    for active in (ITERATIONS, 2):
        state, out = _call_outputs(updates_every_iteration=True, active=active)
        reference_state, reference = _call_outputs(updates_every_iteration=False, active=active)
        assert int(state.step) == active == int(out.updates[0].sum())
        np.testing.assert_array_equal(out.env_steps, reference.env_steps)
        for leaf, reference_leaf in zip(
            jax.tree.leaves(state),
            jax.tree.leaves(reference_state),
            strict=True,
        ):
            np.testing.assert_allclose(leaf, reference_leaf, rtol=1e-5, atol=1e-6)
        assert out.info.metrics.keys() == reference.info.metrics.keys()
        for name, value in out.info.metrics.items():
            np.testing.assert_allclose(value, reference.info.metrics[name], rtol=1e-5, atol=1e-6)
        # The reported iteration's metrics are computed, not the zeros of the others.
        assert np.all(out.info.metrics["loss"] != 0)
        assert np.all(np.isfinite(out.info.metrics["kl/actor_1"]))
