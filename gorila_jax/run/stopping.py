"""The end of a run: nodes stop in the order that keeps the final checkpoint whole (the
learning nodes' stages are their mode's, `learning_modes`)."""

import logging
import time
from typing import Any

from gorila_jax import text
from gorila_jax.distributed import program as program_lib
from gorila_jax.run import learning_modes
from gorila_jax.run.experiment_config import ExperimentConfig


def stop_in_order(running: Any, cfg: ExperimentConfig, final_evaluation: bool = True) -> None:
    """Stops actors, then the evaluator, then the learner (or the Gorila workers, worker 0
    last), whose `run` ends with the final checkpoint.

    Stopped actors insert nothing more and have reported their last counters,
    so the final replay checkpoint and the counters saved with it agree. The
    evaluator, with `final_evaluation`, first evaluates the newest parameters
    (at the final env-step count) unless it has already: every run's history
    ends with an evaluation, and the final checkpoint holds it.
    """
    actors = [running.client(node.name) for node in running.active_nodes("actor")]
    for node in actors:
        node.stop()
    # An actor stops within one step of its envs. One that has not by a heartbeat timeout
    # is hung (in its environment, say; with stall_timeout_s off nobody replaced it): the
    # run ends without it, as it holds nothing the final checkpoint needs, and the
    # launcher's stop ends its process.
    actor_stop_timeout_s = cfg.heartbeat_timeout_s or cfg.startup_timeout_s
    for node in actors:
        if not wait_finished(running, node, actor_stop_timeout_s):
            logging.warning(
                "%s did not stop within %.0f s (hung?); the run ends without it",
                node.node_name,
                actor_stop_timeout_s,
            )
    if cfg.eval_interval_s > 0:
        evaluator = running.client("evaluator")
        evaluator.stop(final_evaluation=final_evaluation)
        wait_finished(running, evaluator)
    for stage in learning_modes.of(cfg).stop_stages(running, cfg):
        learners = [running.client(name) for name in stage]
        for node in learners:
            node.stop()
        for node in learners:
            wait_finished(running, node)


def stop(running: Any, cfg: ExperimentConfig, reason: str) -> str | None:
    """`stop_in_order`; what failed as the run stopped (its final checkpoint on a full
    disk, say), or None. A failure there still ends the run with its summary."""
    try:
        stop_in_order(running, cfg, final_evaluation=reason != "interrupted")
    except Exception as error:  # noqa: BLE001  reported in the summary and the exit code
        # The traceback goes to the log file; the console gets the summary's one line.
        logging.info("the run failed as it stopped", exc_info=True)
        return (
            "the run failed as it stopped, its final checkpoint may be missing: "
            + text.first_line(error)
        )
    return None


def wait_finished(running: Any, node: program_lib.Client, timeout_s: float | None = None) -> bool:
    """Waits for `node`'s `run` to end, `timeout_s` at most; whether it did."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not node.wait_finished(1.0):
        running.check()  # a node that died instead of stopping raises here
        if deadline is not None and time.monotonic() >= deadline:
            return False
    running.check()
    return True
