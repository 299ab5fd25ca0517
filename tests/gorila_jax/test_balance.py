"""Data balance: each actor's share of inserted data, dominant actors reported and replaced.

The rules on fake counters and a fake clock; one real DQN run in which one
actor has far more envs than the other.
"""

import csv
import json
import logging
import os

import pytest

from agents import dqn
from gorila_jax import balance, elastic, experiment, wiring
from tests import fakes
from tests.gorila_jax.test_checkpoint import CONFIG, _experiment
from tests.gorila_jax.test_fault_nodes import _run_with
from tests.gorila_jax.test_elastic import _Actors


@pytest.mark.parametrize(
    "amounts, factor, expected_dominant",
    [
        ({"a": 50, "b": 50}, 1.5, {}),  # even
        ({"a": 80, "b": 20}, 1.5, {"a": 0.8}),  # 0.8 > 1.5 / 2
        ({"a": 70, "b": 30}, 1.5, {}),  # 0.7 is within 0.75
        ({"a": 60, "b": 20, "c": 20}, 1.5, {"a": 0.6}),  # 0.6 > 1.5 / 3
        ({"a": 60, "b": 20, "c": 20}, 2.0, {}),  # 0.6 is within 2 / 3
        ({"a": 100}, 1.5, {}),  # a single actor dominates nobody
        ({"a": 0, "b": 0}, 1.5, {}),  # no data, nothing to judge
    ],
)
def test_dominant_actors(amounts, factor, expected_dominant):
    found = balance.dominant(balance.shares(amounts), factor)
    assert found == pytest.approx(expected_dominant)


def test_shares_sum_to_one():
    assert balance.shares({"a": 3, "b": 1}) == {"a": 0.75, "b": 0.25}


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _counters(**env_steps) -> dict:
    return {name.replace("_", "/"): {"env_steps": steps} for name, steps in env_steps.items()}


def test_the_tracker_judges_each_window_on_what_the_current_actors_did_in_it():
    clock = _Clock()
    tracker = balance.BalanceTracker(1.5, interval_s=10.0, min_env_steps=100, clock=clock)
    actors = ["actor/0", "actor/1"]
    assert not tracker.due()
    clock.now = 10.0
    # Counters from before the first window end are the baseline, not this window's work.
    assert tracker.update(_counters(actor_0=5000, actor_1=100), actors) is None
    clock.now = 20.0
    report = tracker.update(_counters(actor_0=5900, actor_1=200), actors)
    assert report.shares == pytest.approx({"actor/0": 0.9, "actor/1": 0.1})
    assert report.dominant == pytest.approx({"actor/0": 0.9}) and report.limit == 0.75
    assert report.persistent == {}, "one window is not yet a persistent bias"
    clock.now = 25.0
    report = tracker.update(_counters(actor_0=6800, actor_1=300), actors)
    assert report.persistent == pytest.approx({"actor/0": 0.9})
    # actor/2 joins: it is measured from the next window on; removed actor/0 is not.
    clock.now = 30.0
    actors = ["actor/1", "actor/2"]
    report = tracker.update(_counters(actor_0=5900, actor_1=700, actor_2=400), actors)
    assert report.shares == {"actor/1": 1.0}, "a new actor's first partial window counted"
    assert report.dominant == {}
    clock.now = 40.0
    report = tracker.update(_counters(actor_1=1200, actor_2=900), actors)
    assert report.shares == pytest.approx({"actor/1": 0.5, "actor/2": 0.5})
    # A window with too little data (a stalled or starting run) is not judged, nor
    # one in which an actor did nothing (restarting: its peers' shares say nothing).
    clock.now = 50.0
    assert tracker.update(_counters(actor_1=1230, actor_2=930), actors) is None
    clock.now = 60.0
    assert tracker.update(_counters(actor_1=3230, actor_2=930), actors) is None


@pytest.mark.parametrize(
    "factor, interval_s, message",
    [
        (1.0, 30.0, "balance_factor must be above 1"),
        (0.5, 30.0, "balance_factor must be above 1"),
        (2.0, -1.0, "balance_interval_s must not be negative"),
    ],
)
def test_bad_balance_settings_are_rejected(factor, interval_s, message):
    with pytest.raises(ValueError, match=message):
        balance.BalanceTracker(factor, interval_s)


@pytest.mark.parametrize("replace", [False, True])
def test_a_dominant_actor_is_reported_and_optionally_replaced(tmp_path, caplog, replace):
    clock, actors = _Clock(), _Actors(2)
    tracker = balance.BalanceTracker(1.5, interval_s=10.0, min_env_steps=100, clock=clock)
    scaler = elastic.ActorScaler(
        str(tmp_path),
        actors.add,
        actors.remove,
        lambda: list(actors.names),
        balance=tracker,
        replace_dominant=replace,
        clock=clock,
    )
    snapshot = {"env_steps": 0, "learner_steps": 0, "metrics": {}}
    clock.now = 10.0
    assert scaler.poll(snapshot, lambda: _counters(actor_0=0, actor_1=0)) == []
    clock.now = 20.0
    with caplog.at_level(logging.WARNING):
        (line,) = scaler.poll(snapshot, lambda: _counters(actor_0=100, actor_1=900))
    assert "actor/1 inserted 90%" in line and "above 75%" in line
    assert "actor/1 inserted 90%" in caplog.text
    assert scaler.row_fields()["dominant_actors"] == 1
    assert scaler.row_fields()["insert_share_max"] == pytest.approx(0.9)
    assert actors.names == ["actor/0", "actor/1"], "replaced after a single window"
    clock.now = 30.0
    lines = scaler.poll(snapshot, lambda: _counters(actor_0=200, actor_1=1800))
    assert "actor/1 inserted 90%" in lines[0]
    if replace:
        assert "replaced actor/1 by actor/2" in lines[1]
        assert actors.names == ["actor/0", "actor/2"]
    else:
        assert len(lines) == 1 and actors.names == ["actor/0", "actor/1"]


# ---------------------------------------------------------------- a real unbalanced run


def _rows(logdir) -> list[dict[str, str]]:
    with open(os.path.join(logdir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def test_an_actor_with_many_more_envs_is_reported_and_replaced(tmp_path, monkeypatch):
    build_arguments = wiring.actor_arguments

    def actor_1_has_16x_the_envs(builder, cfg, spec, index, nodes, restored):
        args, kwargs = build_arguments(builder, cfg, spec, index, nodes, restored)
        if index == 1:  # args[8] is num_envs; later actors are built as configured
            args = (*args[:8], 16 * cfg.num_envs_per_actor, *args[9:])
        return args, kwargs

    monkeypatch.setattr(wiring, "actor_arguments", actor_1_has_16x_the_envs)
    cfg = _experiment(
        tmp_path,
        num_actors=2,
        num_envs_per_actor=2,
        total_env_steps=10**9,
        eval_interval_s=0.0,
        checkpoint_interval_steps=0,
        heartbeat_interval_s=0.5,
        balance_interval_s=3.0,
        balance_factor=1.5,
        balance_replace=True,
    )

    def wait_for_the_replacement():
        replaced = fakes.wait_until(
            lambda: (
                _nodes(tmp_path).get("actor/1", {}).get("removed")
                and _nodes(tmp_path).get("actor/2", {}).get("counters", {}).get("env_steps", 0) > 0
            ),
            timeout_s=180,
        )
        return {"replaced": replaced}

    _, seen = _run_with(dqn.DQNBuilder(CONFIG), cfg, {}, wait_for_the_replacement)
    assert seen["replaced"], "actor/1 was not replaced by an acting actor/2"
    rows = _rows(tmp_path)
    reported = [row for row in rows if row.get("dominant_actors") not in (None, "", "0")]
    assert reported, "the 16x actor was never reported"
    assert float(reported[0]["insert_share_max"]) > 0.75
    env_steps = [int(row["env_steps"]) for row in rows]
    assert env_steps == sorted(env_steps)


def _nodes(logdir) -> dict:
    try:
        with open(os.path.join(logdir, experiment.NODE_STATUS_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}
