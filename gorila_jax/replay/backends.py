"""Which backend serves a replay: the one place that picks a node class or a connection by
backend name (`api.BACKENDS`)."""

from typing import Any

from gorila_jax.replay import api, native_node, reverb_writer, server


def node_class(backend: str) -> type:
    """The replay node class of `backend`."""
    if backend == api.NATIVE:
        return native_node.NativeReplayNode
    if backend == api.REVERB:
        return server.ReplayNode
    raise ValueError(f"unknown replay backend {backend!r}; choose one of {api.BACKENDS}")


def connect(node: Any, endpoint: api.Endpoint | None = None) -> api.Connection:
    """An actor's connection to the replay node `node` (a program client; `endpoint`: what
    the node's `endpoint()` returned, if asked already)."""
    endpoint = endpoint or node.endpoint()
    if endpoint.backend == api.NATIVE:
        remote = endpoint.address != native_node.process_address()
        return native_node.NativeConnection(node, remote=remote and hasattr(node, "futures"))
    # A ReplayClient: the writer finds a Reverb node restarted at another address.
    return reverb_writer.ReverbConnection(server.ReplayClient(node, endpoint.address))
