"""Launchers: run one `Program` in one process (`local`) or as Ray actors (`ray`)."""

from typing import Any

from gorila_jax.distributed import program as program_lib
from gorila_jax.distributed.launchers import base

LAUNCHERS = ("local", "ray")


def launch(
    program: program_lib.Program, launcher: str = "local", **options: Any
) -> base.RunningProgram:
    """Starts every node of `program` under `launcher`; options go to that launcher."""
    if launcher == "local":
        from gorila_jax.distributed.launchers import local

        return local.launch(program, **options)
    if launcher == "ray":
        # Imported here so that the local launcher never pays for importing Ray.
        from gorila_jax.distributed.launchers import ray as ray_launcher

        return ray_launcher.launch(program, **options)
    raise ValueError(f"unknown launcher {launcher!r}; choose one of {LAUNCHERS}")
