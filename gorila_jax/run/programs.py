"""Which graph a run of one role is: the sync or Gorila graph (`wiring.py`) or the
federated one (`federated_program.py`). Chosen here, so that neither builder imports
the other (the federated program is made of the wiring's parts)."""

from gorila_jax import builder as builder_lib
from gorila_jax import types
from gorila_jax.distributed import program as program_lib
from gorila_jax.learning import checkpoint
from gorila_jax.run import federated_program, wiring
from gorila_jax.run.experiment_config import ExperimentConfig


def make_program(
    builder: builder_lib.AgentBuilder,
    cfg: ExperimentConfig,
    spec: types.EnvSpec,
    resume: checkpoint.Restored | None = None,
) -> program_lib.Program:
    """The run's graph; with `resume`, every node starts from that checkpoint (a
    federated run keeps none: its settings check refuses `--resume`)."""
    if cfg.learner_mode == "federated":
        return federated_program.make_program(builder, cfg, spec)
    return wiring.make_program(builder, cfg, spec, resume)
