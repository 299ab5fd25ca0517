"""Test setup: 4 CPU devices for pmap tests, before anything imports jax."""

import os

_FAKE_DEVICES = "--xla_force_host_platform_device_count=4"
if _FAKE_DEVICES not in os.environ.get("XLA_FLAGS", ""):
    # Append rather than assign: the user may have XLA_FLAGS of their own.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAKE_DEVICES}".strip()

import pytest  # noqa: E402

# Options for the Ray launcher in tests: 2 logical CPUs as on the CI machine,
# a small object store so the cluster starts fast.
RAY_TEST_OPTIONS = {"num_cpus": 2, "object_store_memory": 200 * 1024 * 1024}


@pytest.fixture
def ray_options():
    """Launcher options for a private Ray cluster; asserts it is gone afterwards."""
    import ray

    yield dict(RAY_TEST_OPTIONS)
    if ray.is_initialized():  # a test that failed before stop(): do not leak the cluster
        ray.shutdown()
