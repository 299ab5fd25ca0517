"""config.json: the run's agent and experiment configs as the run recorded them in its
logdir, and read back (`launch.evaluate`, a resume's report of what changed)."""

import dataclasses
import json
import os
from typing import Any

from gorila_jax.learning.checkpoint_files import CheckpointError

CONFIG_FILE = "config.json"


def write_config(logdir: str, builder: Any, experiment: Any) -> None:
    """Writes both configs and the builder's class to `<logdir>/config.json`.

    `launch.evaluate` rebuilds the agent from it; the class is recorded by
    import path so that the skeleton never names an agent.
    """
    config = builder.config
    record = {
        "builder": f"{type(builder).__module__}.{type(builder).__qualname__}",
        "agent_config_class": f"{type(config).__module__}.{type(config).__qualname__}",
        "agent_config": dataclasses.asdict(config),
        "experiment": dataclasses.asdict(experiment),
    }
    os.makedirs(logdir, exist_ok=True)
    path = os.path.join(logdir, CONFIG_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=2)
    os.replace(path + ".tmp", path)


def read_config(logdir: str) -> dict[str, Any]:
    """The record `write_config` wrote.

    Raises:
      CheckpointError: if it is missing or unreadable.
    """
    path = os.path.join(logdir, CONFIG_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found: is {logdir!r} the --logdir of a run?") from None
    except ValueError as error:
        raise CheckpointError(f"{path} is not valid JSON: {error}") from None


def config_from_dict(config_cls: type, values: dict[str, Any], source: str = "config") -> Any:
    """A config dataclass from its `asdict` form; JSON turned its tuples into lists.

    Fields missing from `values` take the class's defaults (a field added
    since the file was written).

    Raises:
      ValueError: naming `source` and every field that `config_cls` does not
        have (a typo, or a file of another version of the agent). Ignoring
        them would rebuild an agent other than the one that was trained.
    """
    if not isinstance(values, dict):
        raise ValueError(
            f"{source}: expected a mapping of {config_cls.__name__} fields, got "
            f"{type(values).__name__}"
        )
    names = {field.name for field in dataclasses.fields(config_cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(
            f"{source} has fields that {config_cls.__name__} does not know: "
            f"{', '.join(unknown)} (known: {', '.join(sorted(names))})"
        )
    return config_cls(**{k: _tuples(v) for k, v in values.items()})


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`field: old -> new` for each field whose value differs (JSON forms compared)."""
    new = json.loads(json.dumps(new))
    return [
        f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]
