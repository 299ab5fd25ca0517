"""agents/conv.py: the same values and gradients as lax's convolution, and, inside a
lax.scan on CPU, only convolutions that XLA:CPU runs with Eigen."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from agents import conv

# Flax's NHWC x HWIO -> NHWC.
NHWC = lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))
CANONICAL = "dim_labels=b01f_01io->b01f"


def _loss(conv_fn, strides, padding):
    def loss(x, w):
        y = conv_fn(x, w, strides, padding, dimension_numbers=NHWC)
        return jnp.sum(jnp.sin(y))

    return loss


@pytest.mark.parametrize(
    "size, channels, kernel, stride, features, padding",
    [
        (36, 4, 8, 4, 8, "VALID"),  # the Nature torso's layers, smaller
        (9, 8, 4, 2, 8, "VALID"),
        (7, 8, 3, 1, 8, "VALID"),
        (10, 4, 3, 1, 8, "SAME"),  # IMPALA's
        (11, 3, 4, 3, 5, "SAME"),  # uneven SAME padding, rows the stride skips
        (13, 3, 5, 2, 4, ((1, 3), (2, 0))),
    ],
)
def test_values_and_gradients_equal_lax(size, channels, kernel, stride, features, padding):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(3, size, size, channels)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(kernel, kernel, channels, features)), jnp.float32)
    args = ((stride, stride), padding)
    expected = jax.value_and_grad(_loss(lax.conv_general_dilated, *args), (0, 1))(x, w)
    got = jax.value_and_grad(_loss(conv.conv_general_dilated, *args), (0, 1))(x, w)
    for e, g in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_other_convolutions_are_lax_unchanged():
    # Dilated, or NCHW: passed to lax as they are, gradients included.
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, 9, 9, 3)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, 3, 3, 4)), jnp.float32)

    def dilated(fn):
        return lambda x, w: jnp.sum(fn(x, w, (1, 1), "SAME", None, (2, 2), NHWC) ** 2)

    def nchw(fn):
        return lambda x, w: jnp.sum(fn(x, w, (1, 1), "VALID") ** 2)

    xt, wt = jnp.transpose(x, (0, 3, 1, 2)), jnp.transpose(w, (3, 2, 0, 1))
    for make, inputs in ((dilated, (x, w)), (nchw, (xt, wt))):
        expected = jax.grad(make(lax.conv_general_dilated), (0, 1))(*inputs)
        got = jax.grad(make(conv.conv_general_dilated), (0, 1))(*inputs)
        for e, g in zip(expected, got):
            np.testing.assert_allclose(g, e, rtol=1e-6)


def _scanned_gradient_convolutions(conv_fn) -> list[str]:
    """The convolutions of two gradient steps, run by lax.scan, of the Nature torso's first
    two layers at Atari's frame size (XLA rewrites some convolutions by their shapes)."""

    def loss(params, x):
        y = jax.nn.relu(conv_fn(x, params[0], (4, 4), "VALID", dimension_numbers=NHWC))
        return jnp.sum(conv_fn(y, params[1], (2, 2), "VALID", dimension_numbers=NHWC) ** 2)

    def train(params, xs):
        def body(params, x):
            grads = jax.grad(loss)(params, x)
            return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), None

        return lax.scan(body, params, xs)[0]

    params = (jnp.ones((8, 8, 4, 32)), jnp.ones((4, 4, 32, 64)))
    xs = jnp.ones((2, 2, 84, 84, 4))
    hlo = jax.jit(train).lower(params, xs).compile().as_text()
    return re.findall(r"convolution\([^\n]*", hlo)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="an XLA:CPU compiler property")
def test_gradient_convolutions_in_a_scan_compile_to_the_fast_form():
    # With lax's convolution, autodiff's backward convolutions stay non-canonical
    # inside the loop (emitted as naive loops, ~40x slower on the Nature torso);
    # with agents/conv.py every convolution is canonical.
    plain = _scanned_gradient_convolutions(lax.conv_general_dilated)
    assert any(CANONICAL not in line for line in plain)
    fast = _scanned_gradient_convolutions(conv.conv_general_dilated)
    assert len(fast) >= 5 and all(CANONICAL in line for line in fast), fast
