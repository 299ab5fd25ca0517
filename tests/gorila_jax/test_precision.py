"""Mixed-precision pieces: loss-scale bookkeeping, device agreement, step skipping, layer clips."""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gorila_jax import parallel, precision


def _scale(scale: float, finite_steps: int = 0) -> precision.LossScale:
    return precision.LossScale(
        jnp.float32(scale), jnp.int32(finite_steps), jnp.zeros((), jnp.int32)
    )


def test_overflow_halves_the_scale_down_to_one_and_restarts_the_count():
    after = precision.update_loss_scale(_scale(256.0, 5), jnp.array(False), period=10)
    assert float(after.scale) == 128.0
    assert int(after.finite_steps) == 0
    assert int(after.skipped_steps) == 1
    floor = precision.update_loss_scale(_scale(1.0), jnp.array(False), period=10)
    assert float(floor.scale) == 1.0


def test_scale_doubles_after_period_finite_steps_and_not_before():
    state = precision.init_loss_scale(256.0)
    scales = []
    for _ in range(7):
        state = precision.update_loss_scale(state, jnp.array(True), period=3)
        scales.append(float(state.scale))
    assert scales == [256.0, 256.0, 512.0, 512.0, 512.0, 1024.0, 1024.0]
    assert int(state.skipped_steps) == 0


def test_loss_scale_round_trip_gives_the_unscaled_gradient():
    scale = _scale(1024.0)
    grad = jax.grad(lambda x: precision.scale_loss(jnp.sum(x**2), scale))(jnp.arange(3.0))
    np.testing.assert_array_equal(precision.unscale_grads(grad, scale), 2 * jnp.arange(3.0))


def test_one_device_with_inf_makes_every_device_skip():
    step = jax.pmap(precision.all_finite, axis_name=parallel.DATA_AXIS, devices=jax.devices()[:4])
    values = np.ones((4, 3), np.float32)
    assert np.asarray(step({"w": values})).tolist() == [True] * 4
    values[2, 1] = np.inf  # only device 2 sees it
    assert np.asarray(step({"w": values})).tolist() == [False] * 4
    values[2, 1] = np.nan
    assert np.asarray(step({"w": values})).tolist() == [False] * 4


def test_select_tree_keeps_the_old_state_bit_for_bit_even_when_the_new_one_is_nan():
    old = {"w": jnp.array([1.0, 2.0]), "step": jnp.int32(3)}
    new = {"w": jnp.array([jnp.nan, jnp.inf]), "step": jnp.int32(4)}
    kept = precision.select_tree(jnp.array(False), new, old)
    np.testing.assert_array_equal(kept["w"], old["w"])
    assert int(kept["step"]) == 3
    taken = precision.select_tree(jnp.array(True), new, old)
    assert int(taken["step"]) == 4


def _nested_grads():
    # Layer norms: Dense_0 = 5 (3-4-0), Torso_0/Conv_0 = 0.5, Torso_0/Conv_1 = 20.
    return {
        "params": {
            "Dense_0": {"kernel": jnp.array([[3.0, 4.0]]), "bias": jnp.zeros(2)},
            "Torso_0": {
                "Conv_0": {"kernel": jnp.full((1, 1, 1, 4), 0.25)},
                "Conv_1": {"kernel": jnp.full((1, 1, 4, 1), 6.0), "bias": jnp.array([16.0])},
            },
        }
    }


def test_layer_norms_name_every_flax_layer():
    norms = {k: float(v) for k, v in precision.layer_norms(_nested_grads()).items()}
    assert norms == pytest.approx({"Dense_0": 5.0, "Torso_0/Conv_0": 0.5, "Torso_0/Conv_1": 20.0})


def test_layer_clip_bounds_each_layer_and_leaves_small_layers_alone():
    grads = _nested_grads()
    clipped = precision.clip_by_layer_norm(grads, 1.0)
    norms = {k: float(v) for k, v in precision.layer_norms(clipped).items()}
    assert norms == pytest.approx({"Dense_0": 1.0, "Torso_0/Conv_0": 0.5, "Torso_0/Conv_1": 1.0})
    small = clipped["params"]["Torso_0"]["Conv_0"]["kernel"]
    np.testing.assert_array_equal(small, grads["params"]["Torso_0"]["Conv_0"]["kernel"])
    # Direction within a layer is kept: the Dense kernel is still 3:4.
    np.testing.assert_allclose(clipped["params"]["Dense_0"]["kernel"], [[0.6, 0.8]], rtol=1e-6)
    with pytest.raises(ValueError, match="must be positive, got 0"):
        precision.clip_by_layer_norm(grads, 0.0)


def test_bfloat16_transport_halves_bytes_keeps_integers_and_survives_pickling():
    params = {"kernel": jnp.linspace(-1.0, 1.0, 64).reshape(8, 8), "count": jnp.int32(7)}
    sent = jax.device_get(precision.cast_floats(params, "bfloat16"))
    assert sent["kernel"].dtype == jnp.bfloat16
    assert sent["kernel"].nbytes == np.asarray(params["kernel"]).nbytes // 2
    assert sent["count"].dtype == np.int32
    np.testing.assert_allclose(sent["kernel"].astype(np.float32), params["kernel"], atol=4e-3)
    # Protocol 5 with out-of-band buffers, as Ray sends arguments and results.
    buffers = []
    payload = pickle.dumps(sent, protocol=5, buffer_callback=buffers.append)
    received = pickle.loads(payload, buffers=buffers)
    assert received["kernel"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        received["kernel"].view(np.uint16), sent["kernel"].view(np.uint16)
    )


def test_bad_precision_names_are_rejected_with_the_choices():
    with pytest.raises(ValueError, match=r"precision must be one of \('fp32', 'bf16', 'fp16'\)"):
        precision.compute_dtype("fp8")
    with pytest.raises(ValueError, match="transport dtype must be one of"):
        precision.cast_floats({"w": jnp.ones(2)}, "float16")
    with pytest.raises(ValueError, match="initial loss scale must be >= 1, got 0.5"):
        precision.init_loss_scale(0.5)
