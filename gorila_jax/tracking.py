"""Experiment tracking with Weights & Biases (`--wandb_project`), off by default.

The driver logs to W&B what it writes to metrics.csv and TensorBoard, row by row,
against env steps (W&B's own step would refuse a resumed run's earlier counts); the
run's config at the start; its summary's figures and curves.png at the end. The W&B
run's id is kept in the logdir, so `--resume` continues the same W&B run. wandb is
imported only by runs that ask for it.
"""

import dataclasses
import math
import os
import secrets
from typing import Any

from gorila_jax import text

RUN_ID_FILE = "wandb_run_id"
# The summary's figures that go to the W&B run's summary (the rest is in its config).
_SUMMARY_FIGURES = (
    "final_eval_return",
    "final_eval_episodes",
    "env_steps",
    "learner_steps",
    "episodes",
    "wall_time_s",
)


class TrackingError(RuntimeError):
    """W&B could not start the run's tracking."""


class WandbTracker:
    """One run's W&B run.

    Args:
      cfg: the experiment config (its wandb_* settings say where to log).
      agent_config: the agent's config dataclass, or role -> config for role groups.

    Raises:
      TrackingError: wandb could not start (no network in online mode, a bad entity).
    """

    def __init__(self, cfg: Any, agent_config: Any):
        import wandb  # here: only runs that ask for W&B pay for its import

        self._wandb = wandb
        logdir = os.path.abspath(cfg.logdir)
        tags = [tag.strip() for tag in cfg.wandb_tags.split(",") if tag.strip()]
        run_id = _run_id(logdir)
        try:
            self._run = wandb.init(
                project=cfg.wandb_project,
                entity=cfg.wandb_entity or None,
                group=cfg.wandb_group or None,
                tags=tags or None,
                name=os.path.basename(logdir),
                id=run_id,
                resume="allow",
                dir=logdir,
                mode=cfg.wandb_mode,
                config={"experiment": dataclasses.asdict(cfg), "agent": _as_dict(agent_config)},
                # Its capture of stdout and stderr would wrap the console's own routing
                # (gorila_jax/console.py); what the run's lines say, its rows carry.
                settings=wandb.Settings(console="off"),
            )
        except Exception as error:  # noqa: BLE001  wandb's errors have no common base
            raise TrackingError(
                f"W&B could not start the run: {text.first_line(error)} (--wandb_mode=offline "
                "keeps it under <logdir>/wandb for `wandb sync`)"
            ) from None
        self._run.define_metric("env_steps")
        self._run.define_metric("*", step_metric="env_steps")
        self.finished = False

    def log(self, row: dict[str, Any]) -> None:
        """One metrics row: its finite numbers."""
        numbers = {
            key: value
            for key, value in row.items()
            if isinstance(value, (int, float)) and math.isfinite(value)
        }
        self._run.log(numbers)

    def finish(self, summary: dict[str, Any] | None, curves_path: str | None) -> None:
        """Ends the W&B run: with the summary's figures and curves.png where they exist
        (None: the run failed before its summary)."""
        self.finished = True
        if summary is not None:
            self._run.summary.update(
                {key: summary[key] for key in _SUMMARY_FIGURES if summary.get(key) is not None}
            )
            if summary.get("problem"):
                self._run.summary["problem"] = summary["problem"]
        if curves_path is not None and os.path.exists(curves_path):
            self._run.log({"curves": self._wandb.Image(curves_path)})
        self._run.finish(exit_code=0 if summary is not None and not summary.get("problem") else 1)


def _run_id(logdir: str) -> str:
    """The W&B run id of the run in `logdir`: kept there, so a resume continues its run."""
    path = os.path.join(logdir, RUN_ID_FILE)
    if os.path.exists(path):
        with open(path) as f:
            run_id = f.read().strip()
        if run_id:
            return run_id
    run_id = secrets.token_hex(4)  # W&B's own ids are 8 lowercase letters and digits
    with open(path, "w") as f:
        f.write(run_id + "\n")
    return run_id


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, dict):  # role -> config
        return {role: dataclasses.asdict(c) for role, c in config.items()}
    return dataclasses.asdict(config)
