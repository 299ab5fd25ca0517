"""A trained run's agent, restored from its checkpoint, for the tools that replay it
(`launch.evaluate`, `launch.record`); and their flag parsing."""

import json
import sys
from typing import Any, Callable, NamedTuple

import jax
from absl import flags

from gorila_jax import console, envs
from gorila_jax.learning import checkpoint
from gorila_jax.learning import config_record
from launch import presets


def define_run_flags(verb: str) -> tuple[Any, Any, Any]:
    """The flags of a tool that plays a run's checkpoint: --logdir, --epsilon and --step
    (their holders, in that order); `verb` says what the tool does ("evaluate", "record")."""
    logdir = flags.DEFINE_string("logdir", None, "The --logdir of a training run.", required=True)
    epsilon = flags.DEFINE_float(
        "epsilon",
        None,
        f"Epsilon of the policy to {verb} with; unset: the run's config.eval_epsilon (DQN: 0.001).",
        lower_bound=0.0,
        upper_bound=1.0,
    )
    step = flags.DEFINE_integer(
        "step", None, f"{verb.capitalize()} this learner step's checkpoint, not the newest."
    )
    return logdir, epsilon, step


class TrainedPolicy(NamedTuple):
    """A run's agent restored from one of its checkpoints."""

    record: dict  # the run's config.json
    builder: Any
    spec: Any
    params: Any  # what its actors act with
    learner_step: int
    env_steps: int  # taken by the run's actors up to the checkpoint


def restore_policy(logdir: str, epsilon: float | None, step: int | None) -> TrainedPolicy:
    """The agent of the run in `logdir` at checkpoint `step` (None: the newest), rebuilt from
    its config.json; `epsilon` replaces its evaluation epsilon (None: keep it)."""
    record = config_record.read_config(logdir)
    builder = presets.builder_from_record(record, epsilon)
    spec = envs.env_spec(record["experiment"]["env_id"])
    target = jax.device_get(builder.init_train_state(jax.random.PRNGKey(0), spec))
    if step is not None and step not in checkpoint.saved_steps(logdir):
        raise checkpoint.CheckpointError(
            f"no checkpoint at learner step {step} in {checkpoint.learner_dir(logdir)}; "
            f"saved steps: {checkpoint.saved_steps(logdir)}"
        )
    restored = checkpoint.restore_newest(logdir, target, steps=None if step is None else [step])
    counters = restored.meta.get("node_counters", {}).values()
    return TrainedPolicy(
        record,
        builder,
        spec,
        builder.state_access.actor_params(restored.state),
        restored.step,
        int(sum(c.get("env_steps", 0) for c in counters)),
    )


def parse_flags(argv: list[str]) -> list[str]:
    """absl parsing, but a bad or missing flag ends the program with one line and exit code 2."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        print(f"error: {error}".replace("\n", " "), file=sys.stderr)
        sys.exit(2)


def report_or_exit(make_report: Callable[[], dict], summary: Callable[[dict], str]) -> None:
    """A tool's work: a checkpoint, value or file error ends it with one `error:` line;
    otherwise it prints the report's one-line summary, then the report as JSON (last).
    Library log lines below an error stay off the console (`console.show_only_what_matters`).
    """
    console.show_only_what_matters()
    try:
        report = make_report()
    except (checkpoint.CheckpointError, ValueError, OSError) as error:
        sys.exit(f"error: {error}".replace("\n", " "))
    print(summary(report), flush=True)
    print(json.dumps(report), flush=True)
