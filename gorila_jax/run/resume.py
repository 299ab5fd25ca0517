"""The resume step's own check: what a resumed run needs of the logdir it continues.

It reads the disk, so it runs once, just before the run readies its logdir
(`experiment._run`, then `tasks.Task.prepare`), not with the settings checks, which
read no files.
"""

import os
from typing import Any

from gorila_jax import multiagent, replay
from gorila_jax.learning import checkpoint
from gorila_jax.run import learning_modes


def check_resumable(cfg: Any) -> None:
    """`cfg.logdir` holds checkpoints (in each role's directory, for a task of several
    roles) of as many replay shards as this run has, written by this run's replay (a
    federated run: the coordinator's checkpoints).

    Raises:
      checkpoint.CheckpointError: naming what is missing or does not match, and how to
        resume instead.
    """
    roles = multiagent.roles_of(cfg.env_id) or (None,)
    for logdir in (checkpoint.role_logdir(cfg.logdir, role) for role in roles):
        if not checkpoint.saved_steps(logdir):
            raise checkpoint.CheckpointError(
                f"resume: no checkpoint in {checkpoint.learner_dir(logdir)} "
                "(is --logdir the one of the run to continue?)"
            )
        if not learning_modes.of(cfg).replay_beside_checkpoint:
            continue  # a federated run's replays are its clients', each restoring its newest
        replay_dirs = checkpoint.saved_replay_dirs(logdir)
        for directory in replay_dirs:
            step = replay.newest_intact_checkpoint(directory)
            if step is not None:
                try:
                    replay.check_backend(os.path.join(directory, str(step)), cfg.replay_backend)
                except replay.IncompatibleCheckpoint as error:
                    raise checkpoint.CheckpointError(str(error)) from None
        if len(replay_dirs) != cfg.num_replay_shards:
            raise checkpoint.CheckpointError(
                f"resume: the checkpoints in {logdir} hold a replay of {len(replay_dirs)} "
                f"shard(s), but num_replay_shards={cfg.num_replay_shards}; resume with "
                f"num_replay_shards={len(replay_dirs)}"
            )
