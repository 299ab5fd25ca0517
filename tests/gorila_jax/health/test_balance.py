"""Data balance: each actor's share of inserted and sampled data, dominant actors reported,
replaced or downweighted.

The rules on fake counters and a fake clock; a learner's row counts on real
sampled keys; real DQN runs (local launcher, Reverb, envpool) in which one
actor has far more envs than the other.
"""

import csv
import dataclasses
import json
import logging
import os

import numpy as np
import pytest

from agents import dqn, ppo, sac
from gorila_jax import envs, replay, types
from gorila_jax.health import balance
from gorila_jax.learning import learner
from gorila_jax.run import elastic, experiment, wiring
from gorila_jax.learning.settings import LearnerSettings
from tests.backends import DefaultReplayNode
from tests import fakes
from tests.gorila_jax.learning.test_checkpoint import CONFIG, _experiment
from tests.gorila_jax.run.test_elastic import _Actors
from tests.gorila_jax.health.test_fault_nodes import _run_with


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


def _balancing_scaler(tmp_path, clock, actors, **remedy) -> elastic.ActorScaler:
    """A driver's scaler over `actors` that judges balance in 10 s windows of >= 100 env steps."""
    tracker = balance.BalanceTracker(1.5, interval_s=10.0, min_env_steps=100, clock=clock)
    return elastic.ActorScaler(
        str(tmp_path),
        actors.add,
        actors.remove,
        lambda: list(actors.names),
        balance=tracker,
        clock=clock,
        **remedy,
    )


@pytest.mark.parametrize("replace", [False, True])
def test_a_dominant_actor_is_reported_and_optionally_replaced(tmp_path, caplog, replace):
    clock, actors = _Clock(), _Actors(2)
    scaler = _balancing_scaler(tmp_path, clock, actors, replace_dominant=replace)
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


def _learner(**rows) -> dict:
    """A learner's counters: rows it sampled per actor (actor_1=5 -> "sampled/actor/1": 5)."""
    return {balance.sampled_counter(name.replace("_", "/")): n for name, n in rows.items()}


def test_the_tracker_measures_each_actors_share_of_the_rows_all_learners_sampled():
    clock = _Clock()
    tracker = balance.BalanceTracker(1.5, interval_s=10.0, min_env_steps=100, clock=clock)
    actors = ["actor/0", "actor/1"]

    def counters(env_0, env_1, learner_0, learner_1):
        return {
            **_counters(actor_0=env_0, actor_1=env_1),
            "learner/0": {"learner_steps": 1, **learner_0},
            "gradient_worker/1": learner_1,
        }

    clock.now = 10.0
    tracker.update(counters(0, 0, _learner(actor_0=10), {}), actors)
    clock.now = 20.0
    # Two learners' rows add up; rows of a removed actor (actor/7) and of items written
    # without a source count in the total only: 50 + 10 + 400 + 40 = 500 rows.
    learner_0 = {**_learner(actor_0=60, actor_1=300), balance.UNKNOWN_SOURCE_COUNTER: 40}
    learner_1 = _learner(actor_1=100, actor_7=10)
    report = tracker.update(counters(100, 900, learner_0, learner_1), actors)
    assert report.rows_sampled == 500
    assert report.sample_shares == pytest.approx({"actor/0": 0.1, "actor/1": 0.8})
    assert report.max_sample_share == pytest.approx(0.8) and report.top_dominant == "actor/1"
    clock.now = 30.0
    # No row sampled in this window (the learner restarting): measured as nothing.
    report = tracker.update(counters(200, 1800, learner_0, learner_1), actors)
    assert report.sample_shares == {} and np.isnan(report.max_sample_share)
    clock.now = 40.0
    # A learner resumed from a checkpoint counts from 0 again: no negative shares.
    report = tracker.update(counters(300, 2700, _learner(actor_0=5), learner_1), actors)
    assert report.sample_shares == {}, report.sample_shares


def test_a_learner_counts_the_rows_it_samples_per_actor_and_scales_weighted_ones():
    # A restarted learner continues the counts it reported last.
    rows = balance.SampledRows({"sampled/actor/1": 10, "learner_steps": 3})
    assert rows.counters() == {"sampled/actor/1": 10}
    keys = replay.SampledKeys(
        np.arange(6, dtype=np.uint64), sources=np.array([0, 1, 1, 1, replay.UNKNOWN_SOURCE, 0])
    )
    assert rows.count(keys) is None, "no weights: priorities go out as computed"
    assert rows.counters() == {
        "sampled/actor/0": 2,
        "sampled/actor/1": 13,
        balance.UNKNOWN_SOURCE_COUNTER: 1,
    }
    assert rows.count(np.arange(4, dtype=np.uint64)) is None  # plain keys name no actor
    assert rows.counters()["sampled/actor/0"] == 2
    rows.set_weights({1: 0.25})
    np.testing.assert_array_equal(rows.count(keys), [1, 0.25, 0.25, 0.25, 1, 1])
    rows.set_weights({})
    assert rows.count(keys) is None
    with pytest.raises(ValueError, match="balance_weight of actor 1 must be in"):
        rows.set_weights({1: 0.0})


def _report(dominant: dict, persistent: dict, sample_shares: dict | None = None):
    shares = {"actor/0": 0.1, "actor/1": 0.1, "actor/2": 0.1, **dominant}
    return balance.BalanceReport(shares, dominant, 0.5, 1e4, persistent, sample_shares or {}, 0)


def test_an_actor_is_downweighted_once_persistently_dominant_and_while_it_dominates():
    weighted = balance.next_weights(_report({"actor/1": 0.7}, {}), {}, 0.5)
    assert weighted == {}, "one window is not yet a persistent bias"
    weighted = balance.next_weights(_report({"actor/1": 0.7}, {"actor/1": 0.7}), weighted, 0.5)
    assert weighted == {"actor/1": 0.5}
    # Still dominant after a window that broke its streak (a peer restarting): kept.
    weighted = balance.next_weights(_report({"actor/1": 0.7}, {}), weighted, 0.5)
    assert weighted == {"actor/1": 0.5}
    # No longer dominant (or no longer acting): lifted.
    assert balance.next_weights(_report({}, {}), weighted, 0.5) == {}


def test_the_downweight_remedy_sends_weights_to_the_learners_and_lifts_them(tmp_path, caplog):
    clock, actors, sent = _Clock(), _Actors(2), []
    scaler = _balancing_scaler(
        tmp_path, clock, actors, sample_weights=sent.append, balance_weight=0.25
    )
    snapshot = {"env_steps": 0, "learner_steps": 0, "metrics": {}}

    def poll(now, env_1, rows_0, rows_1):
        clock.now = now
        learner = {"learner/0": _learner(actor_0=rows_0, actor_1=rows_1)}
        return scaler.poll(
            snapshot, lambda: {**_counters(actor_0=now * 10, actor_1=env_1), **learner}
        )

    assert poll(10.0, 0, 0, 0) == []
    (line,) = poll(20.0, 900, 100, 900)
    assert "actor/1 inserted 90%" in line and "90% of the rows learners sampled" in line
    assert sent == [] and scaler.row_fields()["downweighted_actors"] == 0
    assert scaler.row_fields()["dominant_sample_share"] == pytest.approx(0.9)
    with caplog.at_level(logging.WARNING):
        lines = poll(30.0, 1800, 200, 1800)
    assert "multiply the priorities of actor/1's items by 0.25" in lines[-1]
    assert "multiply the priorities of actor/1's items" in caplog.text
    assert sent == [{1: 0.25}] and scaler.row_fields()["downweighted_actors"] == 1
    assert actors.names == ["actor/0", "actor/1"], "downweighting replaces nobody"
    # Sent again after each judged window (a restarted learner gets them back) ...
    poll(40.0, 2700, 600, 2400)
    assert sent[-1] == {1: 0.25}
    assert scaler.row_fields()["dominant_sample_share"] == pytest.approx(0.6)
    # ... until actor/1 no longer dominates the inserted data: then lifted, once.
    lines = poll(50.0, 2800, 700, 2500)
    assert "actor/1 no longer dominates" in lines[-1]
    assert sent[-1] == {} and scaler.row_fields()["downweighted_actors"] == 0
    poll(60.0, 2900, 800, 2600)
    assert len(sent) == 3, "weights sent again while nobody is weighted"


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(balance_remedy="lower"), "balance_remedy must be one of"),
        (
            dict(balance_remedy="downweight", balance_weight=0.0),
            r"balance_weight must be in \(0, 1\)",
        ),
        (dict(balance_weight=1.0), r"balance_weight must be in \(0, 1\)"),
    ],
)
def test_bad_balance_remedy_settings_are_rejected(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        _experiment(tmp_path, **settings).validate()


def test_downweighting_needs_a_prioritized_table(tmp_path):
    cartpole, pendulum = envs.env_spec("CartPole-v1"), envs.env_spec("Pendulum-v1")
    # PPO's queue and SAC's uniform table have no priorities to lower.
    for builder, spec, sampler in (
        (ppo.PPOBuilder(ppo.PPOConfig()), cartpole, "queue"),
        (sac.SACBuilder(sac.SACConfig()), pendulum, "uniform"),
    ):
        layout = builder.replay_layout(spec)
        with pytest.raises(ValueError, match=f"samples by '{sampler}', without priorities"):
            balance.check_remedy("downweight", layout.sampled)
        # The others work anywhere.
        balance.check_remedy("replace", layout.sampled)
    layout = dqn.DQNBuilder(CONFIG).replay_layout(cartpole)
    balance.check_remedy("downweight", layout.sampled)
    # The run refuses before anything starts or changes in its logdir.
    cfg = _experiment(tmp_path / "run", balance_remedy="downweight")
    with pytest.raises(ValueError, match="balance_remedy='downweight'"):
        experiment.run_experiment(ppo.PPOBuilder(ppo.PPOConfig()), cfg)
    assert not (tmp_path / "run").exists()


def random_transitions(count: int, seed: int) -> types.Transition:
    """CartPole-shaped transitions of random values."""
    rng = np.random.default_rng(seed)
    return types.Transition(
        observation=rng.normal(size=(count, 4)).astype(np.float32),
        action=rng.integers(0, 2, count).astype(np.int32),
        reward=rng.normal(size=count).astype(np.float32),
        discount=np.full(count, 0.97, np.float32),
        next_observation=rng.normal(size=(count, 4)).astype(np.float32),
    )


def _share_of_actor_1(before: dict, after: dict) -> float:
    rows = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    return rows["sampled/actor/1"] / (rows["sampled/actor/1"] + rows["sampled/actor/0"])


def learner_on_a_dqn_table(
    config: dqn.DQNConfig,
) -> tuple:
    """A real learner on DQN's real prioritized table for CartPole, without the rate
    limiter (which would hold samples back with no new inserts); and the items' codec."""
    spec = envs.env_spec("CartPole-v1")
    builder = dqn.DQNBuilder(config)
    codec = builder.replay_layout(spec).codec

    def table():
        limiter = replay.RateLimit(1)
        return [
            replay.prioritized_table(
                dqn.builder.TABLE, 5000, config.priority_exponent, limiter, codec.num_bytes
            )
        ]

    replay_node = DefaultReplayNode(table)
    return (
        replay_node,
        learner.LearnerNode(builder, spec, replay_node, None, 0, LearnerSettings(num_devices=1)),
        codec,
    )


def test_downweighting_lowers_the_dominant_actors_share_of_what_the_learner_samples():
    # 90 % of the items are actor 1's.
    replay_node, node, codec = learner_on_a_dqn_table(CONFIG)
    table = dqn.builder.TABLE

    def steps(count: int) -> dict:
        for _ in range(count):
            assert node.step(timeout=60), "the learner got no batch"
        return node._heartbeat_counters()  # what its heartbeats report

    try:
        writer = replay.connect(replay_node).writer(table)
        for actor, count in ((0, 100), (1, 900)):
            items = codec.encode(random_transitions(count, seed=actor), source=actor)
            writer.write(items, np.ones(count))
        writer.close()
        start = steps(20)  # every item gets its first priority update soon
        unweighted = steps(120)
        node.set_sample_weights({1: 0.1})
        reweighted = steps(60)  # actor 1's items get their scaled priorities
        weighted = steps(120)
    finally:
        node.stop()
        node.close()
        replay_node.close()
    before, after = _share_of_actor_1(start, unweighted), _share_of_actor_1(reweighted, weighted)
    # 0.1 ** priority_exponent (0.6) = 0.25 times the sampling weight for actor 1's items:
    # about 0.9 * 0.25 / (0.9 * 0.25 + 0.1) = 0.69 of the rows; the margin covers TD noise.
    assert before > 0.8, before
    assert after < before - 0.1, (before, after)


# ---------------------------------------------------------------- a real unbalanced run


def _rows(logdir) -> list[dict[str, str]]:
    with open(os.path.join(logdir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def _run_unbalanced(tmp_path, monkeypatch, scenario, **settings) -> dict:
    """A real DQN run (local launcher) whose actor/1 has 16x the envs of actor/0,
    stopped when `scenario()` returns; what the scenario saw."""
    build_arguments = wiring.actor_arguments

    def actor_1_has_16x_the_envs(builder, cfg, spec, index, nodes, restored):
        args, kwargs = build_arguments(builder, cfg, spec, index, nodes, restored)
        if index == 1:  # args[8] is the actor's settings; later actors are built as configured
            more_envs = dataclasses.replace(args[8], num_envs=16 * cfg.num_envs_per_actor)
            args = (*args[:8], more_envs, *args[9:])
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
        balance_interval_s=BALANCE_INTERVAL_S,
        balance_factor=1.5,
        **settings,
    )
    _, seen = _run_with(dqn.DQNBuilder(CONFIG), cfg, {}, scenario)
    env_steps = [int(row["env_steps"]) for row in _rows(tmp_path)]
    assert env_steps == sorted(env_steps)
    return seen


BALANCE_INTERVAL_S = 3.0


def _assert_every_sampled_row_is_attributed(learner_counters: dict) -> None:
    """The learner's rows per actor add up to its updates x batch size: no row was
    trained on without the actor that wrote it being counted."""
    assert balance.UNKNOWN_SOURCE_COUNTER not in learner_counters, learner_counters
    rows = sum(v for k, v in learner_counters.items() if k.startswith(balance.SAMPLED_PREFIX))
    steps = learner_counters["learner_steps"]
    # A heartbeat may fall between an update and the count of its rows.
    assert (steps - 1) * CONFIG.batch_size <= rows <= steps * CONFIG.batch_size, learner_counters


def test_an_actor_with_many_more_envs_is_reported_and_replaced(tmp_path, monkeypatch):
    def wait_for_the_replacement():
        replaced = fakes.wait_until(
            lambda: (
                _nodes(tmp_path).get("actor/1", {}).get("removed")
                and _nodes(tmp_path).get("actor/2", {}).get("counters", {}).get("env_steps", 0) > 0
            ),
            timeout_s=180,
        )
        return {"replaced": replaced, "learner": _nodes(tmp_path)["learner/0"]["counters"]}

    seen = _run_unbalanced(
        tmp_path, monkeypatch, wait_for_the_replacement, balance_remedy="replace"
    )
    assert seen["replaced"], "actor/1 was not replaced by an acting actor/2"
    rows = _rows(tmp_path)
    reported = [row for row in rows if row.get("dominant_actors") not in (None, "", "0")]
    assert reported, "the 16x actor was never reported"
    assert float(reported[0]["insert_share_max"]) > 0.75
    # Its share of what the learner sampled is measured and reported too: most of it.
    sampled = [
        float(row["dominant_sample_share"]) for row in reported if row["dominant_sample_share"]
    ]
    assert sampled, "the dominant actor's sampled share was never reported"
    assert 0.5 < sampled[0] <= 1.0, sampled
    assert seen["learner"]["sampled/actor/1"] > seen["learner"]["sampled/actor/0"]
    _assert_every_sampled_row_is_attributed(seen["learner"])


def _windows(rows: list[dict]) -> list[dict]:
    """One row per balance window: the first row that shows each new report."""
    windows, last = [], None
    for row in rows:
        report = (row.get("insert_share_max"), row.get("dominant_sample_share"))
        if report[0] and report != last:
            windows.append(row)
        last = report
    return windows


@pytest.mark.slow
# In CI: the same weighting on a real learner and table (the share-of-samples test above).
@pytest.mark.extended
def test_downweighting_a_dominant_actor_lowers_its_sampled_share_in_a_real_run(
    tmp_path, monkeypatch
):
    def weighted_windows() -> list[dict]:
        try:
            rows = _rows(tmp_path)
        except (OSError, ValueError):  # being rewritten
            return []
        start = [float(r["wall_time_s"]) for r in rows if r.get("downweighted_actors") == "1"]
        return [
            row
            for row in _windows(rows)
            # The window that made it persistent, and the next (half weighted), left out.
            if start and float(row["wall_time_s"]) >= start[0] + 2 * BALANCE_INTERVAL_S
        ]

    def four_weighted_windows():
        fakes.wait_until(lambda: len(weighted_windows()) >= 4, timeout_s=240)
        return {"learner": _nodes(tmp_path)["learner/0"]["counters"]}

    seen = _run_unbalanced(
        tmp_path,
        monkeypatch,
        four_weighted_windows,
        balance_remedy="downweight",
        balance_weight=0.01,
    )
    windows = _windows(_rows(tmp_path))
    # The window that made actor/1 persistently dominant was measured before the weights
    # were sent (its row is the first to show them); earlier ones include the learner's start.
    persistent = next(row for row in windows if row.get("downweighted_actors") == "1")
    before = float(persistent["dominant_sample_share"])
    after = [float(row["dominant_sample_share"]) for row in weighted_windows()]
    assert len(after) >= 4, after
    assert all(row["dominant_actors"] == "1" for row in weighted_windows()), "still dominant"
    # New items enter at the writer's initial priority and are sampled once before
    # their priority is scaled, so the drop is smaller than on a settled table.
    assert np.mean(after) < before, (before, after)
    _assert_every_sampled_row_is_attributed(seen["learner"])


def _nodes(logdir) -> dict:
    try:
        with open(os.path.join(logdir, experiment.NODE_STATUS_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}
