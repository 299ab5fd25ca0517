"""Replay checkpoints of every backend: the manifest that tells an intact one from a damaged
one, and which backend wrote it.

A checkpoint is a directory `<checkpoint_dir>/<learner step>` holding the
backend's files and MANIFEST.json: each file's size and CRC-32, the table
sizes and the backend's name. Resume and a restarted replay node take the
newest checkpoint whose files match their manifest, and refuse one that
another backend wrote.
"""

import json
import logging
import os
import shutil
import zlib

from gorila_jax.replay import api

CHECKPOINT_MANIFEST = "MANIFEST.json"

NEWEST = -1  # a replay node's restore_step: the newest intact checkpoint

_CRC_BLOCK = 1 << 22


class CheckpointDamaged(Exception):
    """A replay checkpoint whose files are not those that were written."""


class IncompatibleCheckpoint(ValueError):
    """A replay checkpoint whose items this run's agent cannot read (another format or config)."""


def _crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(_CRC_BLOCK):
            crc = zlib.crc32(block, crc)
    return crc


def write_manifest(path: str, table_sizes: dict[str, int], backend: str) -> None:
    """Records every file of the checkpoint at `path` (size and CRC-32), its table sizes
    and the backend that wrote it. Written last: a checkpoint cut short has none."""
    files = {}
    for name in sorted(os.listdir(path)):
        file = os.path.join(path, name)
        files[name] = {"size": os.path.getsize(file), "crc32": _crc32(file)}
    with open(os.path.join(path, CHECKPOINT_MANIFEST), "w") as f:
        json.dump({"backend": backend, "files": files, "table_sizes": table_sizes}, f)


def _read(path: str) -> dict:
    try:
        with open(os.path.join(path, CHECKPOINT_MANIFEST)) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise CheckpointDamaged(
            f"replay checkpoint {path} has no readable manifest: {error}"
        ) from None


def check_checkpoint(path: str) -> dict[str, int]:
    """Table sizes of the replay checkpoint at `path`, after checking its files are intact.

    Raises:
      CheckpointDamaged: the manifest, or a file it lists, is missing, or a file has
        another size or (manifests that record it) another CRC-32 than was written.
    """
    manifest = _read(path)
    for name, written in manifest["files"].items():
        file = os.path.join(path, name)
        # Manifests before CRCs recorded the size alone.
        if isinstance(written, int):
            size, crc = written, None
        else:
            size, crc = written["size"], written["crc32"]
        actual = os.path.getsize(file) if os.path.exists(file) else None
        if actual != size:
            raise CheckpointDamaged(
                f"replay checkpoint file {file} has {actual} bytes, {size} were written"
            )
        if crc is not None and _crc32(file) != crc:
            raise CheckpointDamaged(
                f"replay checkpoint file {file} does not hold the bytes that were written "
                "(CRC-32 differs)"
            )
    return manifest["table_sizes"]


def checkpoint_backend(path: str) -> str:
    """The backend that wrote the checkpoint at `path` (manifests without one: Reverb's)."""
    return _read(path).get("backend", api.REVERB)


def check_backend(path: str, backend: str) -> None:
    """Raises IncompatibleCheckpoint if the checkpoint at `path` is another backend's."""
    written_by = checkpoint_backend(path)
    if written_by != backend:
        raise IncompatibleCheckpoint(
            f"replay checkpoint {path} was written by the {written_by} replay and this run "
            f"uses the {backend} replay: resume with --replay={written_by}, or start the run "
            "afresh (a new logdir, or without --resume)"
        )


def newest_intact_checkpoint(checkpoint_dir: str) -> int | None:
    """The step of the newest replay checkpoint in `checkpoint_dir` whose files are
    intact (`check_checkpoint`); None if there is none. Damaged ones are skipped
    with a warning: a restarted replay goes back one checkpoint rather than fail."""
    steps = (
        sorted((int(name) for name in os.listdir(checkpoint_dir) if name.isdigit()), reverse=True)
        if os.path.isdir(checkpoint_dir)
        else []
    )
    for step in steps:
        try:
            check_checkpoint(os.path.join(checkpoint_dir, str(step)))
            return step
        except CheckpointDamaged as error:
            logging.warning("replay: skipping checkpoint %d: %s", step, error)
    return None


def keep_checkpoints(checkpoint_dir: str, steps) -> None:
    """Deletes the checkpoints in `checkpoint_dir` of every step not in `steps`."""
    kept = set(steps)
    for name in os.listdir(checkpoint_dir):
        if name.isdigit() and int(name) not in kept:
            shutil.rmtree(os.path.join(checkpoint_dir, name), ignore_errors=True)
