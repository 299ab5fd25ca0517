"""Checkpoints of a run: learner state, the run's configs, and how resume finds them.

Layout under `<logdir>/checkpoints/`:
  learner/<step>/   `state.npz` (the agent's train state, an opaque pytree,
                    as raw leaf bytes with a manifest of shapes and dtypes:
                    `checkpoint_files`) and `meta.json` (counters,
                    evaluations, replay sizes)
  replay/<step>/    the Reverb checkpoint taken at the same learner step
                    (written by `replay.ReplayNode.checkpoint`); a replay of
                    K > 1 shards has replay/shard_<k>/<step>/ for each shard

The learner checkpoint at step N is written after the replay checkpoint at N
is complete, and old replay checkpoints are deleted only after that, so a
learner checkpoint always has its replay beside it, whenever a crash comes.
A learner checkpoint is written to a temporary directory and renamed to its
step when complete, and the replay node renames Reverb's finished directory
into place the same way: a partially written checkpoint never carries a
final name and is never loaded. A checkpoint damaged later on disk (a
truncated file fails its zip structure or CRC, or its JSON) fails to restore
and is skipped with a warning in favour of the previous one.

Why not orbax: the learner's state is host numpy arrays written by one
process, and orbax 0.11.5 inside a `jax.distributed` process (the chief of a
multi-host learner) calls `key_value_try_get`, which jaxlib 0.4.34 lacks, and
synchronises every process while only the chief saves. This format needs no
other process.
"""

import dataclasses
import json
import logging
import os
import shutil
import time
import uuid
from typing import Any, Callable, NamedTuple

import jax

from gorila_jax import replay
from gorila_jax.learning import checkpoint_files, config_record
from gorila_jax.learning.checkpoint_files import CheckpointError

LEARNER_DIR = "learner"
REPLAY_DIR = "replay"
ROLES_DIR = "roles"  # <logdir>/roles/<role>: each role group's own config and checkpoints
CLIENTS_DIR = "clients"  # <logdir>/clients/<i>: a federated client's learner and replay
REPLAY_SHARD_PREFIX = "shard_"


def checkpoint_root(logdir: str) -> str:
    """Absolute, so that nodes on Ray (whose working directory differs) write the same place."""
    return os.path.join(os.path.abspath(logdir), "checkpoints")


def role_logdir(logdir: str, role: str | None) -> str:
    """Where role `role` of a program of role groups keeps its config and checkpoints
    (`<logdir>/roles/<role>`); `logdir` itself without a role."""
    return logdir if role is None else os.path.join(logdir, ROLES_DIR, role)


def client_logdir(logdir: str, client: int) -> str:
    """Where client `client` of a federated run keeps its learner and replay checkpoints
    (`<logdir>/clients/<client>`); the run's own checkpoints are the coordinator's."""
    return os.path.join(logdir, CLIENTS_DIR, str(client))


def learner_dir(logdir: str) -> str:
    return os.path.join(checkpoint_root(logdir), LEARNER_DIR)


def replay_dir(logdir: str, shard: int = 0, num_shards: int = 1) -> str:
    """Where replay shard `shard` of `num_shards` checkpoints: `replay/` for a single
    replay (the layout of runs from before sharding, which still resume),
    `replay/shard_<k>/` for each of several."""
    root = os.path.join(checkpoint_root(logdir), REPLAY_DIR)
    return root if num_shards == 1 else os.path.join(root, f"{REPLAY_SHARD_PREFIX}{shard}")


def saved_replay_dirs(logdir: str) -> list[str]:
    """The replay checkpoint directory of each shard the run in `logdir` had (one: `replay/`).

    A shard's directory missing in between is listed all the same: its
    checkpoints then fail to load, as a damaged checkpoint does.
    """
    root = replay_dir(logdir)
    names = os.listdir(root) if os.path.isdir(root) else []
    shards = [
        int(name.removeprefix(REPLAY_SHARD_PREFIX))
        for name in names
        if name.startswith(REPLAY_SHARD_PREFIX) and name.removeprefix(REPLAY_SHARD_PREFIX).isdigit()
    ]
    if not shards:
        return [root]
    count = max(shards) + 1
    return [replay_dir(logdir, shard, count) for shard in range(count)]


def saved_steps(logdir: str) -> list[int]:
    """Learner steps with a finished (renamed) checkpoint directory, oldest first; no reads."""
    directory = learner_dir(logdir)
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def any_saved(logdir: str) -> bool:
    """Whether the run in `logdir` has a finished checkpoint, its own or any role's."""
    roles = os.path.join(logdir, ROLES_DIR)
    role_names = sorted(os.listdir(roles)) if os.path.isdir(roles) else []
    return any(saved_steps(role_logdir(logdir, role)) for role in [None, *role_names])


def run_meta(
    monitor: Any, node: str, counters: dict[str, Any], step: int, **extra: Any
) -> dict[str, Any]:
    """A checkpoint's meta: the monitor's state (every node's counters, recent returns,
    evaluations; {} without a monitor) with `node`'s own `counters` as they are now,
    `extra`, the step saved (`learner_steps`) and the time."""
    meta = monitor.checkpoint_state() if monitor is not None else {}
    meta.setdefault("node_counters", {})[node] = counters
    meta.update(extra)
    meta.update(learner_steps=step, unix_time=time.time())
    return meta


STATE_FILE = "state.npz"
META_FILE = "meta.json"
# Names a save in progress (or one cut short by a crash) has: never final, safe to delete.
_PARTIAL_MARKERS = (".tmp-", ".old-")


class LearnerCheckpoints:
    """Learner-state checkpoints, one directory per learner step, the newest `max_to_keep` kept.

    A save and a restore touch only this process's files: no other process
    (of a multi-host learner) takes part, so the chief alone may save.

    Args:
      directory: the learner checkpoint directory (absolute).
      max_to_keep: older checkpoints are deleted after each save; None keeps all.
      read_only: for readers (resume planning, evaluation) that must not write.
    """

    def __init__(self, directory: str, max_to_keep: int | None = None, read_only: bool = False):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_checkpoints_to_keep must be at least 1, got {max_to_keep}")
        self._directory, self._max_to_keep, self._read_only = directory, max_to_keep, read_only
        if not read_only:
            os.makedirs(directory, exist_ok=True)
            for name in os.listdir(directory):
                if not name.isdigit() and any(marker in name for marker in _PARTIAL_MARKERS):
                    shutil.rmtree(os.path.join(directory, name), ignore_errors=True)

    def steps(self) -> list[int]:
        if not os.path.isdir(self._directory):
            return []
        return sorted(int(name) for name in os.listdir(self._directory) if name.isdigit())

    def save(
        self, step: int, state: Any, meta: dict[str, Any], beside: dict[str, Any] | None = None
    ) -> None:
        """Writes `state` (host arrays) and `meta` (JSON-able) as `step`, replacing one there;
        each of `beside` (name -> host arrays: what a node keeps besides the agent's state)
        in a file of its own in the same checkpoint, `restore_beside` reads it.

        Returns once the checkpoint is on disk under its final name (resume
        and shutdown rely on "returned" meaning "saved").
        """
        if self._read_only:
            raise RuntimeError(f"{self._directory} was opened read-only")
        final = os.path.join(self._directory, str(step))
        partial = f"{final}.tmp-{uuid.uuid4().hex[:8]}"
        os.makedirs(partial)
        try:
            checkpoint_files.write_state(os.path.join(partial, STATE_FILE), state)
            checkpoint_files.write_bytes(
                os.path.join(partial, META_FILE), json.dumps(meta).encode()
            )
            for name, tree in (beside or {}).items():
                checkpoint_files.write_state(os.path.join(partial, f"{name}.npz"), tree)
            if os.path.exists(final):
                # A save at a step that already has one: the final save of a run
                # whose learner did not step since the last one. Counters and
                # replay have moved on, so the newer save wins.
                old = f"{final}.old-{uuid.uuid4().hex[:8]}"
                os.rename(final, old)
                os.rename(partial, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(partial, final)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        checkpoint_files.fsync_directory(self._directory)
        if self._max_to_keep is not None:
            for old_step in self.steps()[: -self._max_to_keep]:
                shutil.rmtree(os.path.join(self._directory, str(old_step)), ignore_errors=True)

    def restore(self, step: int, target: Any) -> tuple[Any, dict[str, Any]]:
        """(state, meta) of step `step`; `target` gives the state's structure, shapes and dtypes.

        Leaves come back as numpy arrays.

        Raises:
          Exception: whatever the file system, zip or JSON readers raise for a
            missing or truncated checkpoint; ValueError for one of another structure.
        """
        directory = os.path.join(self._directory, str(step))
        state = checkpoint_files.read_state(os.path.join(directory, STATE_FILE), target, step)
        with open(os.path.join(directory, META_FILE)) as f:
            meta = json.load(f)
        return state, meta

    def restore_beside(self, step: int, name: str, target: Any) -> Any:
        """What `save` kept as `name` beside the state of checkpoint `step`.

        Raises:
          Exception: as `restore`, for one missing, truncated or of another structure.
        """
        path = os.path.join(self._directory, str(step), f"{name}.npz")
        return checkpoint_files.read_state(path, target, step)

    def restore_newest(self, target: Any, owner: str) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, meta) of the newest checkpoint that loads, or None if none does.

        Damaged ones are skipped with a warning naming `owner` (the node).
        """
        for step in reversed(self.steps()):
            try:
                state, meta = self.restore(step, target)
            except Exception:  # noqa: BLE001  a damaged one: try the one before
                logging.warning("%s: checkpoint %d does not load", owner, step, exc_info=True)
                continue
            return step, state, meta
        return None


class Restored(NamedTuple):
    """The newest checkpoint that restored completely."""

    step: int
    state: Any
    meta: dict[str, Any]


def restore_newest(
    logdir: str, target: Any, need_replay: bool = False, steps: list[int] | None = None
) -> Restored:
    """Restores the newest usable learner checkpoint, skipping damaged ones with a warning.

    Args:
      logdir: the run's logdir.
      target: a state of the agent (for structure, shapes and dtypes).
      need_replay: also require the replay checkpoint of the same step to be intact.
      steps: only consider these steps (default: all that exist).

    Raises:
      CheckpointError: if there is no checkpoint, or none of them restores.
    """
    directory = learner_dir(logdir)
    candidates = saved_steps(logdir) if steps is None else sorted(steps)
    if not candidates:
        raise CheckpointError(f"no checkpoint in {directory}")
    checkpoints = LearnerCheckpoints(directory, read_only=True)
    problems = []
    for step in reversed(candidates):
        try:
            state, meta = checkpoints.restore(step, target)
            if need_replay:
                for replay_directory in saved_replay_dirs(logdir):
                    replay.check_checkpoint(os.path.join(replay_directory, str(step)))
            return Restored(step, state, meta)
        except Exception as error:  # noqa: BLE001  any failure means: use an older one
            detail = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            problems.append(f"step {step}: {detail}")
            logging.warning("skipping checkpoint %s/%d: %s", directory, step, detail)
    raise CheckpointError(
        f"none of the {len(candidates)} checkpoints in {directory} could be restored "
        f"(newest first: {'; '.join(problems)})"
    )


def find_resume_point(logdir: str, target: Any, need_replay: bool = True) -> Restored:
    """The newest checkpoint whose learner state (and replay, with `need_replay`) is intact.

    Newer, unusable checkpoints are deleted (with a warning each), so that
    the resumed run's own checkpoints are the newest ones.

    Raises:
      CheckpointError: if no checkpoint is usable.
    """
    restored = restore_newest(logdir, target, need_replay=need_replay)
    remove_newer(logdir, restored.step)
    return restored


def prepare_logdir(
    logdir: str,
    resume: bool,
    builder: Any,
    experiment: Any,
    init_state: Callable[[], Any],
    need_replay: bool = True,
) -> Restored | None:
    """Finds the checkpoint to resume from; then records the configs.

    Args:
      logdir: the run's logdir.
      resume: continue the run there; otherwise a new run starts (an earlier run's
        files were set aside: `gorila_jax/run/logdir.py`).
      builder, experiment: the agent's builder and the experiment config.
      init_state: makes a fresh train state, the target for restoring.
      need_replay: the run's checkpoints have their replay beside them, which a resume
        needs intact too (a federated run's replays are its clients').

    Returns:
      The checkpoint to resume from, or None for a new run.
    """
    restored = None
    if resume:
        _print_config_changes(logdir, builder, experiment)
        restored = find_resume_point(logdir, jax.device_get(init_state()), need_replay)
        replay_sizes = restored.meta.get("replay", {}).get("table_sizes")
        print(
            f"resuming from learner step {restored.step:,} ({total(restored.meta, 'env_steps'):,} "
            f"env steps, replay {replay_sizes}) in {logdir}",
            flush=True,
        )
    elif saved_steps(logdir):
        # The run layer moves an earlier run aside before a new one starts: a checkpoint
        # here would be mixed into the new run's.
        raise CheckpointError(
            f"{logdir} holds the checkpoints of an earlier run: set it aside first "
            "(gorila_jax.run.logdir.set_aside) or resume it"
        )
    config_record.write_config(logdir, builder, experiment)
    return restored


def total(meta: dict[str, Any], counter: str) -> int:
    """A counter summed over the nodes in a checkpoint's meta (env steps over actors)."""
    return int(sum(c.get(counter, 0) for c in meta.get("node_counters", {}).values()))


def _print_config_changes(logdir: str, builder: Any, experiment: Any) -> None:
    try:
        saved = config_record.read_config(logdir)
    except CheckpointError:
        return
    for part, now in (("agent_config", builder.config), ("experiment", experiment)):
        changes = config_record.config_differences(saved.get(part, {}), dataclasses.asdict(now))
        changes = [change for change in changes if not change.startswith("resume:")]
        if changes:
            print(f"resume: {part} changed since the checkpoint: {'; '.join(changes)}", flush=True)


def remove_newer(logdir: str, step: int) -> None:
    """Deletes learner and replay checkpoints newer than `step` (unusable ones resume skipped).

    The resumed run writes its own history from `step` on; a stale newer
    checkpoint would otherwise pass for the newest one.
    """
    for root in (learner_dir(logdir), *saved_replay_dirs(logdir)):
        if not os.path.isdir(root):
            continue
        for name in os.listdir(root):
            if name.isdigit() and int(name) > step:
                logging.warning("removing unusable checkpoint %s", os.path.join(root, name))
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
