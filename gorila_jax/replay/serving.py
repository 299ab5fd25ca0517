"""Where a Reverb replay server listens: its port (free, or refused by name) and the
address other hosts reach it at."""

import errno
import logging
import socket
from typing import Any

import reverb

# Any routable address: a UDP connect only picks the route toward it, nothing is sent.
_ROUTE_PROBE = ("8.8.8.8", 53)


def reachable_host() -> str:
    """The IPv4 address other hosts reach this one at, found as Ray finds a node's IP.

    That of the interface the host's default route leaves by; on a host
    without one, the address its name resolves to (loopback in a sandbox).
    Ray gives a node the same address unless `ray start --node-ip-address`
    names another, so a replay node on any host of a Ray cluster advertises
    one the cluster's other nodes reach.
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(_ROUTE_PROBE)
        return probe.getsockname()[0]
    except OSError:
        return _name_address()
    finally:
        probe.close()


def _name_address() -> str:
    try:
        return socket.gethostbyname(socket.getfqdn())
    except OSError:  # a host name that does not resolve
        return socket.gethostbyname("localhost")


class PortInUse(OSError):
    """The replay server's port is taken by another process."""


def _check_port_free(port: int) -> None:
    """Raises PortInUse, naming the port, if a listener holds it on any interface.

    Reverb binds `[::]:port` (every interface) and, when that fails, says only
    "Failed to BuildAndStart gRPC server". SO_REUSEADDR as gRPC sets it: the
    connections of a killed predecessor (TIME_WAIT) do not count as a user.
    """
    if not 0 < port < 65536:
        raise ValueError(f"replay port must be in 1..65535, got {port}")
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this host
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, port))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise PortInUse(
                        f"replay port {port} is already in use by another process "
                        "(choose another --replay_port, or 0 for a free one)"
                    ) from None
                if family == socket.AF_INET6:
                    continue  # IPv6 present but not bindable here; IPv4 decides
                raise


def start_server(
    tables: list, port: int | None, any_port_if_taken: bool, checkpointer: Any
) -> reverb.Server:
    """A Reverb server of `tables` on `port` (None: any free one).

    Raises:
      PortInUse: `port` is taken (and `any_port_if_taken` is False, or it was taken
        between the check and the bind).
    """
    if port is not None:
        try:
            _check_port_free(port)
        except PortInUse:
            if not any_port_if_taken:
                raise
            logging.warning(
                "replay: port %d was taken since it was picked; serving on another", port
            )
            port = None
    try:
        return reverb.Server(tables, port=port, checkpointer=checkpointer)
    except ValueError as error:
        if port is not None and "BuildAndStart" in str(error):
            # Taken between the check and the bind; Reverb's message names no port.
            raise PortInUse(f"replay port {port} is already in use ({error})") from None
        raise
