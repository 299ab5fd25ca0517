"""The value checks every config's `validate()` shares, so each rule has one wording.

Every message names the field (with the caller's prefix, "config." for agent
configs) and the value it got. `setting` declares an experiment setting with
its check, its help and its group once; launch/train.py makes its flag from
that declaration and `check_settings` runs its check.
"""

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

POSITIVE = "positive"
NON_NEGATIVE = "non-negative"
PORT_RANGE = (0, 65535)


# Written as `not value > 0` and alike: NaN fails every comparison, so `value <= 0` let it
# through (a learning rate of nan passed, and the run died 10 s later).
def check_positive(name: str, value: Any) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")


def check_non_negative(name: str, value: Any) -> None:
    if not value >= 0:
        raise ValueError(f"{name} must not be negative, got {value}")


def check_finite_floats(config: Any, prefix: str = "") -> None:
    """Every float field of the dataclass `config` (and every float in a tuple field) must
    be finite: no setting here means anything at nan or inf.

    Raises:
      ValueError: naming the first field, in declaration order, that is not.
    """
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        values = value if isinstance(value, (tuple, list)) else (value,)
        for item in values:
            if isinstance(item, float) and not math.isfinite(item):
                raise ValueError(f"{prefix}{field.name} must be a finite number, got {value}")


def check_unit_interval(name: str, value: Any) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def check_one_of(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_in_range(name: str, value: Any, low: Any, high: Any) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name} must be in {low}..{high}, got {value}")


def check_fields(
    config: Any,
    *,
    prefix: str = "",
    choices: Mapping[str, tuple] | None = None,
    positive: Iterable[str] = (),
    non_negative: Iterable[str] = (),
    unit_interval: Iterable[str] = (),
) -> None:
    """Checks the named fields of `config`: choices first, then each bound.

    Args:
      config: the object whose attributes are checked.
      prefix: put before each field's name in the messages ("config.").
      choices: field name -> the values it may take.
      positive, non_negative, unit_interval: names of fields that must be
        > 0, >= 0, or within [0, 1].

    Raises:
      ValueError: naming the first field whose value breaks its rule (any float field
        that is not finite first).
    """
    check_finite_floats(config, prefix)
    for name, allowed in (choices or {}).items():
        check_one_of(prefix + name, getattr(config, name), allowed)
    for names, check in (
        (positive, check_positive),
        (non_negative, check_non_negative),
        (unit_interval, check_unit_interval),
    ):
        for name in names:
            check(prefix + name, getattr(config, name))


def setting(
    default: Any,
    group: str,
    help: str,
    *,
    check: str | tuple | None = None,
    choices: tuple | None = None,
    flag: str | None = None,
) -> Any:
    """A dataclass field declared with everything its flag and its check need.

    Args:
      default: the value when neither a flag nor a preset sets it.
      group: the subsystem it belongs to ("actors", "replay", ...); its flag is
        listed under it in `--helpfull`.
      help: what it does, as its flag's help.
      check: POSITIVE, NON_NEGATIVE, or an inclusive (low, high) range;
        `check_settings` enforces it and its flag takes it as bounds.
      choices: the values it may take (its flag is an enum).
      flag: the flag's name where it differs from the field's (command lines
        and the README use the shorter name).
    """
    metadata = {"group": group, "help": help, "check": check, "choices": choices, "flag": flag}
    return dataclasses.field(default=default, metadata=metadata)


def flag_bounds(check: str | tuple | None, kind: type) -> tuple[Any, Any]:
    """The (lower, upper) bounds a flag parser enforces for `check`; None: unbounded.

    A positive float has no closed lower bound, so it is left to `check_settings`.
    """
    if isinstance(check, tuple):
        return check
    if check == NON_NEGATIVE:
        return kind(0), None
    if check == POSITIVE and kind is int:
        return 1, None
    return None, None


def check_settings(config: Any) -> None:
    """Runs the check and the choices each field of `config` was declared with (`setting`).

    Raises:
      ValueError: naming the first field, in declaration order, whose value breaks its rule
        (any float field that is not finite first).
    """
    check_finite_floats(config)
    for field in dataclasses.fields(config):
        value, check = getattr(config, field.name), field.metadata.get("check")
        if field.metadata.get("choices") is not None:
            check_one_of(field.name, value, field.metadata["choices"])
        if check == POSITIVE:
            check_positive(field.name, value)
        elif check == NON_NEGATIVE:
            check_non_negative(field.name, value)
        elif isinstance(check, tuple):
            check_in_range(field.name, value, *check)


def demo_row_count(rows: int, fraction: float) -> int:
    """Demonstration rows in a batch of `rows` at share `fraction`: fraction * rows rounded
    half up, as `replay.demo_rows` spreads them."""
    return math.floor(rows * fraction + 0.5)


def replay_tiers(
    hot_size: int, cold_size: int, max_size: int, min_size: int
) -> tuple[int, int] | None:
    """(hot, cold) items of a tiered replay (gorila_jax/replay/tiers.py), from
    config.hot_replay_size and config.cold_replay_size (0: the rest of max_replay_size);
    None when hot_replay_size is 0 (everything in memory).

    Raises:
      ValueError: naming the field whose value cannot work.
    """
    if hot_size < 0 or cold_size < 0:
        raise ValueError(
            f"config.hot_replay_size and config.cold_replay_size must be >= 0, got {hot_size} "
            f"and {cold_size}"
        )
    if not hot_size:
        if cold_size:
            raise ValueError(
                f"config.cold_replay_size={cold_size} needs a tiered replay: set "
                "config.hot_replay_size, the items kept in memory"
            )
        return None
    cold_size = cold_size or max_size - hot_size
    if cold_size < 1:
        raise ValueError(
            f"config.hot_replay_size={hot_size} leaves no cold tier of "
            f"config.max_replay_size={max_size}: make it smaller, or set config.cold_replay_size"
        )
    if min_size > hot_size:
        raise ValueError(
            f"config.min_replay_size={min_size} exceeds config.hot_replay_size={hot_size}: the "
            "learner starts once the hot tier holds min_replay_size items"
        )
    return hot_size, cold_size


def check_demo_fraction(fraction: float, batch_size: int) -> None:
    """config.demo_fraction: 0 (no demonstrations), or a share that leaves every batch of
    `batch_size` rows at least one demonstration row and one of the agent's own."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"config.demo_fraction must lie in [0, 1), got {fraction}")
    demo_rows = demo_row_count(batch_size, fraction)
    if fraction and not 0 < demo_rows < batch_size:
        raise ValueError(
            f"config.demo_fraction={fraction} gives {demo_rows} demonstration rows in a batch "
            f"of {batch_size}; it needs at least one of each kind"
        )
