"""Schedules that follow the run's budget, not the preset's.

A preset fits its schedules (DQN's learning-rate cosine, importance-exponent anneal,
batch growth and epsilon decay; PPO's learning-rate decay) to its own budget: the
cartpole preset's cosine reaches 0 after 15,000 updates, the end of its 120k env
steps. Run with `--total_env_steps=500000`, it learned nothing after 120k (issue 36).
Here each schedule keeps the part of the budget the preset gave it, measured in its
unit at the run's own budget and rates: a schedule of the whole budget in updates
stays the whole budget in updates, with the run's batch size and replay ratio.

An agent config declares its schedules in `budget_schedules()` (field -> unit) and its
`updates_per_env_step()`; a config without them has nothing to fit (SAC). A schedule
the user set (`--config.<field>`, or a preset file's `agent:`) is kept as set.
"""

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from gorila_jax.run import experiment

UPDATES, ACTOR_ENV_STEPS = "updates", "actor_env_steps"
_UNIT_NAMES = {UPDATES: "updates", ACTOR_ENV_STEPS: "env steps per actor"}


@dataclasses.dataclass(frozen=True)
class Budget:
    """What a schedule's length is a part of: env steps over so many actors."""

    env_steps: int
    num_actors: int

    def units(self, config: Any, unit: str) -> float:
        """The budget in `unit`, at `config`'s rates."""
        if unit == UPDATES:
            return self.env_steps * config.updates_per_env_step()
        if unit == ACTOR_ENV_STEPS:
            return self.env_steps / self.num_actors
        raise ValueError(f"unknown schedule unit {unit!r}")


def preset_budget(settings: Mapping[str, Any]) -> Budget | None:
    """The budget a preset fitted its schedules to: its total_env_steps over its actors
    (the experiment's default count where it names none); None where it has no total."""
    if "total_env_steps" not in settings:
        return None
    defaults = {
        field.name: field.default for field in dataclasses.fields(experiment.ExperimentConfig)
    }
    return Budget(settings["total_env_steps"], settings.get("num_actors", defaults["num_actors"]))


def declared(config: Any) -> dict[str, str]:
    """`config`'s schedules that follow the budget: field -> unit."""
    return config.budget_schedules() if hasattr(config, "budget_schedules") else {}


def fit(
    config: Any,
    reference: Any,
    reference_budget: Budget | None,
    budget: Budget,
    kept: Collection[str] = (),
) -> Any:
    """`config` with each schedule the part of `budget` it was of `reference_budget` in
    `reference` (the preset's config, fitted to the preset's budget).

    Unchanged where the preset has no budget of its own (a config's defaults are not
    fitted to one), for fields in `kept`, and for 0 (a schedule turned off).
    """
    if reference_budget is None:
        return config
    fitted = {}
    for field, unit in declared(config).items():
        length = getattr(reference, field)
        if field in kept or not length:
            continue
        part = length / reference_budget.units(reference, unit)
        fitted[field] = max(1, round(part * budget.units(config, unit)))
    return dataclasses.replace(config, **fitted)


def describe(config: Any, budget: Budget, kept: Collection[str] = ()) -> str | None:
    """One line of what each schedule runs over, for the run's console; None without any."""
    schedules = declared(config)
    if not schedules:
        return None
    parts = []
    for field, unit in schedules.items():
        length = getattr(config, field)
        said = "off" if not length else f"{length:,} {_UNIT_NAMES[unit]}"
        parts.append(f"{field} {said}" + (" (as set)" if field in kept else ""))
    return f"schedules for {budget.env_steps:,} env steps: " + ", ".join(parts)
