import jax


def test_four_fake_devices():
    assert jax.device_count() == 4, "tests/conftest.py must set XLA_FLAGS before jax is imported"
