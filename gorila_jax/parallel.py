"""Data-parallel helpers for the learner: one axis name, one sharding rule.

Only this module adds or removes the leading device axis, and only it names the
axis: agents call `psum`, `pmean`, `pmax` and `device_index` inside their
per-device functions.
"""

from typing import Any, Callable, Sequence

import jax
import numpy as np

from gorila_jax import compat

DATA_AXIS = "data"


def local_devices(num_devices: int) -> list[jax.Device]:
    """The first `num_devices` local devices (0: all of them).

    Raises:
      ValueError: if the host has fewer.
    """
    available = jax.local_devices()
    if num_devices > len(available):
        raise ValueError(
            f"num_learner_devices={num_devices} but this host has {len(available)} devices"
        )
    return available[: num_devices or None]


def psum(tree: Any) -> Any:
    """Sums `tree` over learner devices; call only inside a pmapped step."""
    return jax.lax.psum(tree, axis_name=DATA_AXIS)


def pmean(tree: Any) -> Any:
    """Averages `tree` over learner devices; call only inside a pmapped step."""
    return jax.lax.pmean(tree, axis_name=DATA_AXIS)


def pmax(tree: Any) -> Any:
    """Maximum of `tree` over learner devices; call only inside a pmapped step."""
    return jax.lax.pmax(tree, axis_name=DATA_AXIS)


def device_index() -> jax.Array:
    """This device's position among the learner devices; call only inside a pmapped step.

    With `step_device_count`, a step can draw randomness for the whole global
    batch from its replicated key and keep its own rows, so that a sharded
    update draws the same numbers per item as a one-device update.
    """
    return jax.lax.axis_index(DATA_AXIS)


def step_device_count() -> int:
    """How many learner devices the pmapped step runs on (a Python int at trace time)."""
    return psum(1)


def shard(batch: Any, num_devices: int) -> Any:
    """Reshapes every leaf from [B, ...] to [D, B/D, ...] on the host.

    Raises:
      ValueError: if B is not divisible by the number of devices.
    """

    def split(x):
        x = np.asarray(x)
        if x.shape[0] % num_devices:
            raise ValueError(
                f"batch of {x.shape[0]} does not split over {num_devices} learner devices"
            )
        return x.reshape((num_devices, x.shape[0] // num_devices) + x.shape[1:])

    return jax.tree.map(split, batch)


def shard_to_devices(batch: Any, devices: Sequence[jax.Device]) -> Any:
    """`shard` on the host, then each [B/D, ...] slice copied to its device."""
    sharded = shard(batch, len(devices))  # [D, B/D, ...]
    return jax.tree.map(lambda x: compat.put_sharded(x, devices, DATA_AXIS), sharded)


def per_device(stacked: Any, devices: Sequence[jax.Device]) -> Any:
    """Row i of every leaf of `stacked` ([D, ...]) on devices[i]: what each device keeps of
    its own (its key, say)."""
    return jax.tree.map(lambda x: compat.put_sharded(np.asarray(x), devices, DATA_AXIS), stacked)


def unshard(tree: Any) -> Any:
    """Inverse of `shard`: [D, B/D, ...] -> [B, ...]."""
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), tree)


def replicate(tree: Any, devices: Sequence[jax.Device]) -> Any:
    """Puts one copy of `tree` on each device, with a leading device axis."""
    return jax.tree.map(lambda leaf: compat.put_replicated(leaf, devices, DATA_AXIS), tree)


def replicate_changed(
    tree: Any, previous: Any, previous_replicated: Any, devices: Sequence[jax.Device]
) -> Any:
    """`replicate(tree)`, reusing the device copies of leaves that `tree` shares with `previous`.

    A leaf counts as shared when it is the same object (`state._replace` keeps
    the untouched ones): a Gorila worker that swaps in new parameters then
    copies only those, not the optimizer state it never changes.
    """
    reuse = {
        id(leaf): copy
        for leaf, copy in zip(jax.tree.leaves(previous), jax.tree.leaves(previous_replicated))
    }
    leaves, treedef = jax.tree.flatten(tree)
    copies = [
        reuse[id(leaf)] if id(leaf) in reuse else compat.put_replicated(leaf, devices, DATA_AXIS)
        for leaf in leaves
    ]
    return jax.tree.unflatten(treedef, copies)


def unreplicate(tree: Any) -> Any:
    """Takes the first device's copy of replicated state (still on device)."""
    return jax.tree.map(compat.first_copy, tree)


def pmap_step(
    step_fn: Callable,
    devices: Sequence[jax.Device],
    out_axes: Any = 0,
    donate_state: bool = True,
    in_axes: Any = 0,
) -> Callable:
    """Compiles a per-device `(state, batch) -> outputs` step.

    The state's buffers are donated (reused for the new state) unless
    `donate_state` is False, for steps that read the state without replacing it.
    `out_axes=None` for an output marks it identical on every device (for
    example parameters after a pmean-ed update): it comes back without the
    device axis. `in_axes=None` for an argument likewise: every device gets it whole.
    """
    return jax.pmap(
        step_fn,
        axis_name=DATA_AXIS,
        in_axes=in_axes,
        devices=list(devices),
        donate_argnums=0 if donate_state else (),
        out_axes=out_axes,
    )
