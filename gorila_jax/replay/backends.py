"""Which backend serves a replay: the one place that picks a node class or a connection by
backend name (`api.BACKENDS`), and that imports the Reverb backend, which only the DeepMind
dependency set installs."""

import importlib
import importlib.util
import types
from typing import Any

from gorila_jax.replay import api, native_node, native_table

# The modules of the Reverb backend: the only ones that import reverb or tensorflow.
REVERB_MODULES = (
    "reverb_sampler",
    "reverb_tables",
    "reverb_writer",
    "sampling",
    "server",
    "serving",
    "shard_streams",
    "tiers",
)


class BackendMissing(ImportError):
    """The replay backend asked for is not installed in this dependency set."""


def installed(backend: str) -> bool:
    """Whether this dependency set installs what `backend` needs."""
    if backend == api.REVERB:
        return all(_findable(name) for name in ("reverb", "tensorflow"))
    return backend == api.NATIVE


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a finder that refuses it (bench/without.py)
        return False


def _missing(detail: str) -> BackendMissing:
    return BackendMissing(
        f"--replay={api.REVERB} needs dm-reverb, which this dependency set does not "
        f"install ({detail}): the DeepMind set has it (DEEPMIND=1 bash launch/train.sh "
        f"makes .venv-deepmind, Python 3.10); --replay={api.NATIVE} needs nothing more"
    )


# The DeepMind set's replay is Reverb's, as the design has it; the default set has only ours.
DEFAULT_BACKEND = api.REVERB if installed(api.REVERB) else api.NATIVE


# The most items one table of each backend holds: Reverb's Python binding takes a table's
# max_size as a C++ int (a larger one fails with a pybind TypeError).
MAX_TABLE_SIZE = {api.NATIVE: native_table.MAX_ITEMS, api.REVERB: 2**31 - 1}


def check_table_sizes(backend: str, specs: list[api.TableSpec]) -> None:
    """Raises ValueError for a table (of one shard) larger than `backend` can hold."""
    limit = MAX_TABLE_SIZE[backend]
    for spec in specs:
        if spec.max_size > limit:
            raise ValueError(
                f"replay table {spec.name!r} would hold {spec.max_size:,} items per shard, and "
                f"a table of --replay={backend} holds {limit:,} at most: lower "
                "--config.max_replay_size or split the replay over more --num_replay_shards"
            )


def require(backend: str) -> None:
    """Raises BackendMissing (naming the set that has it) if `backend` is not installed."""
    if backend == api.REVERB and not installed(api.REVERB):
        raise _missing("no module named 'reverb'")


def reverb_module(name: str) -> types.ModuleType:
    """`gorila_jax.replay.<name>`, a module of the Reverb backend, imported on first use.

    Raises:
      BackendMissing: dm-reverb (or its TensorFlow) is not installed here.
    """
    if name not in REVERB_MODULES:
        raise ValueError(f"{name!r} is not a module of the Reverb backend {REVERB_MODULES}")
    try:
        return importlib.import_module(f"gorila_jax.replay.{name}")
    except ImportError as error:
        if error.name is not None and error.name.split(".")[0] not in ("reverb", "tensorflow"):
            raise
        raise _missing(str(error)) from error


def node_class(backend: str) -> type:
    """The replay node class of `backend`."""
    if backend == api.NATIVE:
        return native_node.NativeReplayNode
    if backend == api.REVERB:
        return reverb_module("server").ReplayNode
    raise ValueError(f"unknown replay backend {backend!r}; choose one of {api.BACKENDS}")


def connect(node: Any, endpoint: api.Endpoint | None = None) -> api.Connection:
    """An actor's connection to the replay node `node` (a program client; `endpoint`: what
    the node's `endpoint()` returned, if asked already)."""
    endpoint = endpoint or node.endpoint()
    if endpoint.backend == api.NATIVE:
        remote = endpoint.address != native_node.process_address()
        return native_node.NativeConnection(node, remote=remote and hasattr(node, "futures"))
    # A ReplayClient: the writer finds a Reverb node restarted at another address.
    server = reverb_module("server")
    return reverb_module("reverb_writer").ReverbConnection(
        server.ReplayClient(node, endpoint.address)
    )
