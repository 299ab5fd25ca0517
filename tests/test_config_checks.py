"""`gorila_jax.config_checks`: each rule refuses a bad value naming the field and the value."""

import dataclasses

import pytest

from gorila_jax import config_checks
from gorila_jax.config_checks import NON_NEGATIVE, POSITIVE, setting


@dataclasses.dataclass
class _Config:
    steps: int = 1
    rate: float = 0.5
    noise: float = 0.0
    mode: str = "a"


@pytest.mark.parametrize(
    "values, message",
    [
        ({"mode": "c"}, "config.mode must be one of ('a', 'b'), got 'c'"),
        ({"steps": 0}, "config.steps must be positive, got 0"),
        ({"noise": -0.1}, "config.noise must not be negative, got -0.1"),
        ({"rate": 1.5}, r"config.rate must lie in [0, 1], got 1.5"),
    ],
)
def test_check_fields_names_the_field_and_its_value(values, message):
    config = dataclasses.replace(_Config(), **values)
    with pytest.raises(ValueError) as error:
        config_checks.check_fields(
            config,
            prefix="config.",
            choices={"mode": ("a", "b")},
            positive=("steps",),
            non_negative=("noise",),
            unit_interval=("rate",),
        )
    assert str(error.value) == message


def test_check_fields_accepts_the_bounds_themselves():
    config = _Config(steps=1, rate=1.0, noise=0.0, mode="b")
    config_checks.check_fields(
        config, choices={"mode": ("a", "b")}, positive=("steps",), unit_interval=("rate",)
    )
    config_checks.check_fields(dataclasses.replace(config, rate=0.0), unit_interval=("rate",))


@dataclasses.dataclass
class _Settings:
    count: int = setting(2, "actors", "How many.", check=POSITIVE)
    wait_s: float = setting(0.0, "faults", "How long.", check=NON_NEGATIVE, flag="wait")
    port: int = setting(0, "replay", "Where.", check=config_checks.PORT_RANGE)
    kind: str = setting("x", "run", "Which.", choices=("x", "y"))
    free: int = setting(-3, "run", "Anything.")


def test_a_setting_carries_its_declaration_in_the_field():
    fields = {field.name: field for field in dataclasses.fields(_Settings)}
    assert _Settings().count == 2
    assert dict(fields["wait_s"].metadata) == {
        "group": "faults",
        "help": "How long.",
        "check": NON_NEGATIVE,
        "choices": None,
        "flag": "wait",
    }


@pytest.mark.parametrize(
    "values, message",
    [
        ({"count": 0}, "count must be positive, got 0"),
        ({"wait_s": -1.0}, "wait_s must not be negative, got -1.0"),
        ({"port": 65536}, "port must be in 0..65535, got 65536"),
        ({"kind": "z"}, "kind must be one of ('x', 'y'), got 'z'"),
    ],
)
def test_check_settings_runs_each_fields_declared_check(values, message):
    config_checks.check_settings(_Settings())
    with pytest.raises(ValueError) as error:
        config_checks.check_settings(_Settings(**values))
    assert str(error.value) == message


def test_flag_bounds_are_the_closed_bounds_of_a_check():
    assert config_checks.flag_bounds(POSITIVE, int) == (1, None)
    assert config_checks.flag_bounds(POSITIVE, float) == (None, None)  # > 0 is not closed
    assert config_checks.flag_bounds(NON_NEGATIVE, float) == (0.0, None)
    assert config_checks.flag_bounds(config_checks.PORT_RANGE, int) == (0, 65535)
    assert config_checks.flag_bounds(None, int) == (None, None)
