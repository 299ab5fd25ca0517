"""The end of a run: nodes stop in the order that keeps the final checkpoint whole, then
the final parameters are fetched from whichever node holds them."""

import logging
import time
from typing import Any

from gorila_jax import builder as builder_lib
from gorila_jax import text, types
from gorila_jax.distributed import program as program_lib
from gorila_jax.federated import nodes as federated_nodes
from gorila_jax.gorila import parameter_server
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
    if cfg.learner_mode == "federated":
        # No round may start while clients stop.
        coordinator = running.client(f"{federated_nodes.GROUP}/0")
        coordinator.stop()
        wait_finished(running, coordinator)
    if cfg.learner_mode == "gorila":
        # Worker 0 takes the final checkpoint (of each role's groups, in a program of
        # role groups), so the others stop first: a gradient they pushed after its
        # snapshot would be lost on resume.
        groups = [
            group for group in running.program.groups if base_group(group) == "gradient_worker"
        ]
        stages = [
            [
                running.client(f"{group}/{i}")
                for group in groups
                for i in range(1, cfg.num_learners)
            ],
            [running.client(f"{group}/0") for group in groups],
        ]
    else:
        # A multi-host learner's processes stop together (their stop votes agree); so do
        # the learners of the roles of a program of role groups.
        stages = [
            [
                running.client(spec.name)
                for group, specs in running.program.groups.items()
                if base_group(group) == "learner"
                for spec in specs
            ]
        ]
    for learners in stages:
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


def base_group(group: str) -> str:
    """A group's kind, whatever role it serves: "learner@prey" -> "learner"."""
    return group.partition(program_lib.ROLE_MARK)[0]


def final_params(
    running: Any, builder: builder_lib.AgentBuilder, cfg: ExperimentConfig, spec: types.EnvSpec
) -> tuple[int, Any]:
    """(version, parameters) at the end: the learner's, assembled from the Gorila shards, or
    the federated coordinator's."""
    if cfg.learner_mode == "gorila":
        shards = [running.client(f"parameter_server/{i}") for i in range(cfg.num_ps_shards)]
        return parameter_server.sharded_parameters(
            shards, builder, spec, cfg.seed, "driver"
        ).get_params()
    if cfg.learner_mode == "federated":
        return running.client(f"{federated_nodes.GROUP}/0").get_params()  # the global model
    return running.client("learner/0").get_params()  # the chief of a multi-host learner


def wait_finished(running: Any, node: program_lib.Client, timeout_s: float | None = None) -> bool:
    """Waits for `node`'s `run` to end, `timeout_s` at most; whether it did."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not node.wait_finished(1.0):
        running.check()  # a node that died instead of stopping raises here
        if deadline is not None and time.monotonic() >= deadline:
            return False
    running.check()
    return True
