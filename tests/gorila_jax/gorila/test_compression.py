"""Wire compression: decode(encode(g)) error bounds, measured byte savings, 1-bit convergence."""

import numpy as np
import pytest

from gorila_jax.gorila import compression

SIZE = 10_000


def _gradient(seed: int = 0, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 1e-2, size).astype(np.float32)


@pytest.mark.parametrize(
    "scheme, relative_error, min_factor",
    [("none", 0.0, 1.0), ("bf16", 2**-8, 2.0), ("fp16", 2**-11, 2.0)],
)
def test_casts_keep_each_value_within_their_rounding_and_halve_the_bytes(
    scheme, relative_error, min_factor
):
    gradient = _gradient()
    encoded = compression.GradientCompressor(scheme).encode(gradient)
    decoded = compression.decode(encoded)
    assert decoded.dtype == np.float32 and decoded.shape == gradient.shape
    # Plus float16's subnormal spacing for values near 0.
    np.testing.assert_array_less(
        np.abs(decoded - gradient), relative_error * np.abs(gradient) + 2**-24
    )
    assert gradient.nbytes / encoded.nbytes >= min_factor


def test_fp16_saturates_instead_of_sending_inf():
    decoded = compression.decode(
        compression.GradientCompressor("fp16").encode(np.array([1e6, -1e6, 1.0], np.float32))
    )
    assert np.isfinite(decoded).all() and decoded[0] == np.finfo(np.float16).max


def test_sparse_sends_large_values_exactly_and_drops_small_ones():
    gradient = _gradient()
    gradient[::10] = 1.0  # 10% of the values are large
    compressor = compression.GradientCompressor("sparse", threshold=0.5)
    encoded = compressor.encode(gradient)
    decoded = compression.decode(encoded)
    np.testing.assert_array_equal(decoded[::10], 1.0)
    assert np.count_nonzero(decoded) == SIZE // 10
    # 10% kept: a 1-bit mask (SIZE / 8 bytes) beats 4-byte indices (0.4 * SIZE bytes).
    assert encoded.nbytes == SIZE // 8 + 4 * SIZE // 10
    very_sparse = np.zeros(SIZE, np.float32)
    very_sparse[:5] = 1.0
    encoded = compressor.encode(very_sparse)
    assert encoded.nbytes == 5 * 8  # index and value of each kept value
    np.testing.assert_array_equal(compression.decode(encoded), very_sparse)


def test_onebit_keeps_signs_and_block_scales_and_is_28_times_smaller():
    gradient = _gradient()
    encoded = compression.GradientCompressor("onebit").encode(gradient)
    decoded = compression.decode(encoded)
    assert (np.sign(decoded) == np.where(gradient >= 0, 1, -1)).all()
    first_block = gradient[: compression.BLOCK]
    np.testing.assert_allclose(np.abs(decoded[: compression.BLOCK]), np.abs(first_block).mean())
    assert gradient.nbytes / encoded.nbytes >= 28.0  # 4 / (1/8 + 4/256) = 28.4


def _onebit_sum_error(steps: int, feedback: bool) -> float:
    """Mean |sum of sent - sum of true gradients| after `steps` 1-bit messages."""
    compressor = compression.GradientCompressor("onebit")
    error = np.zeros(SIZE, np.float32)
    for step in range(steps):
        if not feedback:
            compressor = compression.GradientCompressor("onebit")
        gradient = _gradient(step)
        error += compression.decode(compressor.encode(gradient)) - gradient
    return float(np.abs(error).mean())


def test_onebit_error_feedback_keeps_the_summed_error_from_growing():
    # With feedback the error is what waits in the residual: it does not grow
    # with the number of steps; without it, errors add up like a random walk.
    with_feedback = [_onebit_sum_error(steps, feedback=True) for steps in (50, 200)]
    without = _onebit_sum_error(200, feedback=False)
    assert with_feedback[1] < 1.5 * with_feedback[0]
    assert with_feedback[1] < without / 5


def _descend(scheme: str, steps: int = 300, learning_rate: float = 0.1) -> float:
    """Gradient descent on 0.5 * sum(c * (x - t)^2) with compressed gradients."""
    rng = np.random.default_rng(0)
    curvature = rng.uniform(0.5, 2.0, 1000).astype(np.float32)
    target = rng.normal(size=1000).astype(np.float32)
    x = np.zeros(1000, np.float32)
    compressor = compression.GradientCompressor(scheme)
    for _ in range(steps):
        x -= learning_rate * compression.decode(compressor.encode(curvature * (x - target)))
    return float(np.linalg.norm(x - target) / np.linalg.norm(target))


def test_onebit_with_error_feedback_converges_on_a_quadratic():
    assert _descend("none") < 1e-6
    assert _descend("onebit") < 0.05


def test_unknown_scheme_and_bad_input_are_rejected():
    with pytest.raises(ValueError, match="compression must be one of"):
        compression.GradientCompressor("twobit")
    with pytest.raises(ValueError, match="flat float32 vector"):
        compression.GradientCompressor("bf16").encode(np.zeros((2, 2), np.float32))


def test_parameter_deltas_track_the_sender_without_drift():
    encoder, decoder = compression.DeltaEncoder(), compression.DeltaDecoder()
    params = _gradient(0) * 100
    first = encoder.encode(params)
    np.testing.assert_array_equal(decoder.apply(first), params)
    sizes = []
    for step in range(100):
        params = params + _gradient(step + 1) * 1e-2  # every value moves, as under Adam
        encoded = encoder.encode(params)
        sizes.append(encoded.nbytes)
        received = decoder.apply(encoded)
        # Off by at most the bf16 rounding of one delta, however many came before.
        assert np.abs(received - params).max() < 2**-8 * 1e-3
    assert max(sizes) * 2 <= first.nbytes


def test_parameter_deltas_are_sparse_when_few_values_move():
    encoder, decoder = compression.DeltaEncoder(), compression.DeltaDecoder()
    params = _gradient(0)
    decoder.apply(encoder.encode(params))
    params = params.copy()
    params[:10] += 1.0
    encoded = encoder.encode(params)
    assert encoded.scheme == "delta-sparse" and encoded.nbytes == 10 * 8
    np.testing.assert_array_equal(decoder.apply(encoded), params)


def test_a_delta_before_the_full_parameters_is_an_error():
    encoder = compression.DeltaEncoder()
    encoder.encode(_gradient(0))
    with pytest.raises(ValueError, match="before the full parameters"):
        compression.DeltaDecoder().apply(encoder.encode(_gradient(1)))
