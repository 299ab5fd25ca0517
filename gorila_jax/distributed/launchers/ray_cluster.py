"""The Ray cluster a `ray` launch runs on: a private local one, or one it joins, with
the checkout shipped to its workers and their log lines routed."""

import os
import socket
import sys
from typing import Any

import ray
from ray._private import ray_logging

from gorila_jax import console
from gorila_jax.distributed import program as program_lib


def start_or_join(
    program: program_lib.Program,
    address: str | None,
    num_cpus: int | None,
    object_store_memory: int | None,
) -> bool:
    """Connects this process to a Ray cluster for `program`: the one running already,
    the one at `address`, or (None) a private local cluster; returns whether the
    launcher owns the connection (and shuts it down when the program stops).

    Raises:
      ConnectionError: `address` cannot be reached or joined (saying why).
    """
    console.route_ray_logger()
    if ray.is_initialized():
        return False
    if address is None:
        wanted = sum(program.resources(spec.group).num_cpus for spec in program.nodes)
        ray.init(
            # "local": always a private cluster; None would join one that
            # `ray start` (or another test's Cluster) left on this machine.
            address="local",
            num_cpus=num_cpus or max(os.cpu_count() or 1, int(wanted + 0.999)),
            object_store_memory=object_store_memory,
            include_dashboard=False,
            # Workers import gorila_jax and agents from this checkout.
            runtime_env={"env_vars": {"PYTHONPATH": _pythonpath()}},
        )
    else:
        _connect(address)  # our connection only; the cluster itself keeps running
    _route_worker_logs()
    return True


def _route_worker_logs() -> None:
    """Under a quiet console (`console.route_third_party_logs`), the lines Ray forwards
    from worker processes go to the third-party log, and those that matter (our
    warnings, anyone's errors) to the console too.

    Ray has no public hook for this: its driver prints forwarded lines through the
    "ray_print_logs" handler of its stream dispatcher (Ray 2.60), replaced here.
    """
    log = console.third_party_log()
    if log is None:
        return

    def forward(data: dict[str, Any]) -> None:
        if data.get("pid") == "autoscaler":
            return  # its cluster status every few seconds, which Ray itself does not print
        source = data.get("actor_name") or data.get("task_name") or "worker"
        prefix = f"({source} pid={data.get('pid')}) "
        for line in data.get("lines", ()):
            log.write(prefix + line + "\n")
            if console.worker_line_matters(line):
                print(prefix + line, file=sys.stderr, flush=True)

    dispatcher = ray_logging.global_worker_stdstream_dispatcher
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("ray_print_logs", forward)


def _pythonpath() -> str:
    return os.pathsep.join(p for p in (console.REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)


def _connect(address: str, probe_timeout_s: float = 5.0) -> None:
    """Joins an existing cluster and ships this checkout to its workers.

    Raises:
      ConnectionError: at once if nothing listens at `address`; `ray.init`
        itself would retry for minutes.
    """
    if address != "auto":
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=probe_timeout_s).close()
        except (OSError, ValueError) as error:
            raise ConnectionError(
                f"cannot reach the Ray cluster at --ray_address={address!r}: {error}"
            ) from None
    try:
        ray.init(
            address=address,
            runtime_env={
                "working_dir": console.REPO_ROOT,
                "excludes": [".venv", ".venv-deepmind", ".git", ".cache", "runs"],
            },
        )
    except ConnectionError as error:
        # Ray's message names only the address; the reason (a refused token, a GCS
        # that timed out) is the last line of the error it chains.
        cause = str(error.__cause__ or "").strip().splitlines()
        reason = f" ({cause[-1]})" if cause else ""
        # Ray 2.60 clusters started with `ray start` require token authentication.
        hint = ""
        if os.environ.get("RAY_AUTH_MODE") != "token":
            hint = (
                "; if the cluster uses token authentication (Ray's default for `ray start`), "
                "export RAY_AUTH_MODE=token and make its token available "
                "(~/.ray/auth_token or RAY_AUTH_TOKEN)"
            )
        raise ConnectionError(
            f"cannot join the Ray cluster at {address!r}: {error}{reason}{hint}"
        ) from None
