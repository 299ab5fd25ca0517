"""The files of a learner checkpoint, written durably and read back against the agent's state.

The train state (an opaque pytree of host arrays) is one `.npz` of raw leaf
bytes with a manifest of leaf paths, shapes and dtypes: raw bytes, because
`np.save` loses dtypes numpy does not know (bfloat16), and the manifest lets
a restore refuse a state of another structure rather than mix up leaves.
Every file is fsync'd before the checkpoint's directory is renamed to its
step, and the rename itself is made durable (`fsync_directory`), so a crash
never leaves a final name over a partial write.
"""

import json
import os
from typing import Any

import jax
import numpy as np

_MANIFEST = "manifest"


class CheckpointError(Exception):
    """No usable checkpoint where one is needed."""


def _leaf_paths(tree: Any) -> tuple[list[str], list[Any]]:
    with_paths, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(path) for path, _ in with_paths], [x for _, x in with_paths]


def write_state(path: str, state: Any) -> None:
    """`state`'s leaves as raw bytes, and a manifest of their paths, shapes and dtypes."""
    paths, leaves = _leaf_paths(state)
    arrays = [np.asarray(leaf) for leaf in leaves]
    manifest = [[p, list(a.shape), str(a.dtype)] for p, a in zip(paths, arrays)]
    members = {
        f"leaf_{i}": np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        for i, a in enumerate(arrays)
    }
    members[_MANIFEST] = np.frombuffer(json.dumps(manifest).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **members)
        f.flush()
        os.fsync(f.fileno())


def read_state(path: str, target: Any, step: int) -> Any:
    """The state `write_state` wrote to `path`, as numpy leaves in `target`'s structure.

    Raises:
      ValueError: naming checkpoint `step` and the first leaf whose path,
        shape or dtype differs from `target`'s.
    """
    paths, leaves = _leaf_paths(target)
    expected = [np.asarray(leaf) for leaf in leaves]
    with np.load(path) as saved:
        manifest = json.loads(saved[_MANIFEST].tobytes())
        saved_paths = [entry[0] for entry in manifest]
        if saved_paths != paths:
            first = next(
                (f"{a} vs {b}" for a, b in zip(saved_paths, paths) if a != b),
                f"{len(saved_paths)} leaves vs {len(paths)}",
            )
            raise ValueError(
                f"checkpoint {step} holds a state of another structure than this agent's "
                f"(saved vs expected: {first})"
            )
        restored = []
        for i, ((leaf_path, shape, dtype), want) in enumerate(zip(manifest, expected)):
            if tuple(shape) != want.shape or dtype != str(want.dtype):
                raise ValueError(
                    f"checkpoint {step} holds a {dtype}{list(shape)} leaf {leaf_path} where "
                    f"this agent has {want.dtype}{list(want.shape)}"
                )
            restored.append(saved[f"leaf_{i}"].view(want.dtype).reshape(want.shape))
    return jax.tree.unflatten(jax.tree.structure(target), restored)


def write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_directory(directory: str) -> None:
    """Makes a rename inside `directory` durable (a crash after it keeps the new name)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
