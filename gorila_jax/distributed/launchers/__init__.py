"""Launchers: run one `Program` in one process (`local`), as Ray actors (`ray`), or as
dm-launchpad courier nodes (`launchpad`, on the Launchpad dependency set only).

`anakin` runs its program as `local` does: the program itself differs (a learner acting
in its own JAX envs, gorila_jax/anakin), not where its nodes run."""

from typing import Any

from gorila_jax.distributed import program as program_lib
from gorila_jax.distributed.launchers import base

LAUNCHERS = ("local", "ray", "launchpad", "anakin")
LAUNCHPAD_LAUNCH_TYPES = base.LAUNCHPAD_LAUNCH_TYPES
# What the ray launcher does and launchpad does not; a launchpad run prints it at start.
LAUNCHPAD_LIMITS = (
    "launchpad launcher: a node that fails ends the run (no restarts), no elastic actors, "
    "no placement or clusters; --launcher=ray has those"
)


def launch(
    program: program_lib.Program, launcher: str = "local", **options: Any
) -> base.RunningProgram:
    """Starts every node of `program` under `launcher`; options go to that launcher."""
    if launcher in ("local", "anakin"):
        from gorila_jax.distributed.launchers import local

        return local.launch(program, **options)
    if launcher == "ray":
        # Imported here so that the local launcher never pays for importing Ray.
        from gorila_jax.distributed.launchers import ray as ray_launcher

        return ray_launcher.launch(program, **options)
    if launcher == "launchpad":
        try:
            from gorila_jax.distributed.launchers import launchpad as launchpad_launcher
        except ImportError as error:
            raise ImportError(
                f"--launcher=launchpad needs the Launchpad dependency set ({error}): "
                "DEEPMIND=1 bash launch/train.sh makes it (.venv-deepmind, Python 3.10)"
            ) from error
        return launchpad_launcher.launch(program, **options)
    raise ValueError(f"unknown launcher {launcher!r}; choose one of {LAUNCHERS}")
