"""The one place that knows which JAX a dependency set runs.

The default set has JAX 0.11, whose `pmap` is built on `jit` and `shard_map` (0.8 on) and
which dropped `jax.device_put_replicated` and `jax.device_put_sharded` (deprecated in
0.8.1): arrays with a leading device axis are laid out by a `NamedSharding` over a 1-D
mesh of the learner's devices. The DeepMind set has JAX 0.4.34, whose `pmap` takes its
inputs laid out by those two functions (a `PmapSharding`); anything else it copies again.
`gorila_jax.parallel` calls these; nothing else looks at JAX's version.
"""

from typing import Any, Sequence

import jax
import numpy as np

JAX_VERSION = tuple(int(part) for part in jax.__version__.split(".")[:3])
# jax_pmap_shmap_merge became the default in 0.8.0 (docs.jax.dev/en/latest/migrate_pmap.html).
PMAP_ON_SHARD_MAP = JAX_VERSION >= (0, 8, 0)


def _device_axis(devices: Sequence[jax.Device], axis_name: str) -> jax.sharding.NamedSharding:
    mesh = jax.sharding.Mesh(np.asarray(devices), (axis_name,))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(axis_name))


def put_sharded(stacked: np.ndarray, devices: Sequence[jax.Device], axis_name: str) -> jax.Array:
    """`stacked[i]` on `devices[i]`, as one array with a leading device axis."""
    if not PMAP_ON_SHARD_MAP:
        return jax.device_put_sharded(list(stacked), list(devices))
    return jax.device_put(stacked, _device_axis(devices, axis_name))


def put_replicated(leaf: Any, devices: Sequence[jax.Device], axis_name: str) -> jax.Array:
    """A copy of `leaf` on each of `devices`, as one array with a leading device axis."""
    if not PMAP_ON_SHARD_MAP:
        return jax.device_put_replicated(leaf, list(devices))
    host = np.asarray(leaf)[None]
    return jax.make_array_from_single_device_arrays(
        (len(devices),) + host.shape[1:],
        _device_axis(devices, axis_name),
        [jax.device_put(host, device) for device in devices],
    )


def first_copy(stacked: Any) -> Any:
    """`stacked[0]` of an array with a leading device axis, on the device that holds row 0
    alone: indexing a `NamedSharding` array gives an array spread over all its devices,
    which a one-device computation cannot take with its own arrays."""
    if not PMAP_ON_SHARD_MAP or not isinstance(stacked, jax.Array):
        return stacked[0]
    for shard in stacked.addressable_shards:
        if shard.index[0].start in (0, None):
            return shard.data[0]
    return stacked[0]  # row 0 lives on another host: what indexing gives


def backends_started() -> bool:
    """Whether JAX has started its backends (the CPU client's thread pool is then fixed).
    Not public API in either set (`jax._src.xla_bridge`, present in 0.4.34 and 0.11)."""
    from jax._src import xla_bridge  # noqa: PLC0415

    return xla_bridge.backends_are_initialized()
