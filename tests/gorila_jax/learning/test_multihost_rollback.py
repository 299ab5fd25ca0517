"""A multi-host learner rolls back as a one-host learner does: 2 `MultiHostLearnerNode`
processes (jax.distributed over loopback, gloo), each sampling its share from a replay of
its own; after `max_nonfinite_steps` non-finite updates in a row both return to the
chief's checkpoint, with the learning-rate scale lowered, after the same update.

The file is also the child program: `python -m tests.gorila_jax.learning.test_multihost_rollback
--process_id=...` is one learner process.
"""

import argparse
import hashlib
import json
import os
import pathlib
import sys
import time
import traceback

import jax
import numpy as np
import pytest

from agents import dqn
from gorila_jax import parallel
from gorila_jax.distributed import multihost
from gorila_jax.learning import multihost_learner, sync_learner
from gorila_jax.learning.settings import LearnerSettings
from tests.gorila_jax.distributed.test_multihost import NUM_PROCESSES, run_processes
from tests.gorila_jax.learning.test_fault_numeric import CONFIG, _fill, _NanBatches
from tests.agents.dqn.test_learning import SPEC
from tests.backends import DefaultReplayNode

MAX_NONFINITE_STEPS = 2


class _FileRendezvous:
    """`multihost.Rendezvous` through a file: the test's processes share no program node."""

    def __init__(self, path: str):
        self._path = path

    def publish(self, coordinator_address: str) -> None:
        tmp = self._path + ".tmp"
        with open(tmp, "w") as f:
            f.write(coordinator_address)
        os.replace(tmp, self._path)

    def coordinator_address(self, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(self._path):
                return pathlib.Path(self._path).read_text()
            time.sleep(0.1)
        return None


def _state_bits(node) -> list[bytes]:
    state = jax.device_get(parallel.unreplicate(node._state))
    return [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(state)]


def _child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--process_id", type=int, required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    builder = dqn.DQNBuilder(CONFIG)
    replay_node = DefaultReplayNode(
        lambda: builder.replay_layout(SPEC).tables,
        checkpoint_dir=os.path.join(args.dir, f"replay{args.process_id}"),
    )
    node = multihost_learner.MultiHostLearnerNode(
        builder,
        SPEC,
        replay_node,
        None,
        seed=0,
        settings=LearnerSettings(max_nonfinite_steps=MAX_NONFINITE_STEPS, rollback_lr_factor=0.5),
        start=sync_learner.LearnerStart(os.path.join(args.dir, "learner")),
        num_learner_hosts=NUM_PROCESSES,
        learner_process_id=args.process_id,
        rendezvous=_FileRendezvous(os.path.join(args.dir, "coordinator")),
    )
    chief = args.process_id == 0
    try:
        _fill(replay_node, builder, 300)
        for _ in range(3):
            assert node.step(timeout=60)
        if chief:
            node.save_checkpoint()
        saved = _state_bits(node)
        for _ in range(2):  # the saved state is left behind
            assert node.step(timeout=60)
        moved = _state_bits(node) != saved
        node._prefetcher = _NanBatches(node._prefetcher, node._devices)
        steps = 0
        while node.numeric_status()["rollbacks"] == 0 and steps < 2 * MAX_NONFINITE_STEPS + 2:
            assert node.step(timeout=60)
            steps += 1
        status = node.numeric_status()
        result = {
            "rollbacks": status["rollbacks"],
            "lr_scale": status["lr_scale"],
            "nan_steps": steps,
            "moved_before": moved,
            "back_at_checkpoint": _state_bits(node) == saved,
            "state_digest": hashlib.sha256(b"".join(_state_bits(node))).hexdigest(),
        }
        pathlib.Path(args.dir, f"result{args.process_id}.json").write_text(json.dumps(result))
    except BaseException:
        # Now, not after the shutdown below: that waits for the other process, which may
        # wait in a collective for this one, until the job aborts without a word of why.
        traceback.print_exc()
        sys.stdout.flush()
        raise
    finally:
        node.stop()
        node.close()
        replay_node.close()
        multihost.shutdown()


@pytest.mark.slow
def test_both_processes_roll_back_to_the_chiefs_checkpoint_after_the_same_update(tmp_path):
    run_processes(
        "tests.gorila_jax.learning.test_multihost_rollback",
        lambda i: [f"--process_id={i}", f"--dir={tmp_path}"],
        timeout_s=600,
    )
    results = [json.loads((tmp_path / f"result{i}.json").read_text()) for i in range(NUM_PROCESSES)]
    for i, result in enumerate(results):
        assert result["moved_before"], f"process {i}: the updates after the checkpoint did nothing"
        assert result["rollbacks"] == 1 and result["lr_scale"] == 0.5, (i, result)
        assert result["back_at_checkpoint"], f"process {i} is not at the chief's checkpoint"
    assert results[0]["nan_steps"] == results[1]["nan_steps"], "not after the same update"
    assert results[0]["state_digest"] == results[1]["state_digest"]


if __name__ == "__main__":
    _child_main(sys.argv[1:])
