"""Elastic actors: nodes added to and removed from running programs, the control file, the policy.

The launcher tests run real nodes (threads, Ray processes); the policy and
the scaler's rules are checked with fake clocks; real DQN runs (sync and
Gorila mode) are resized from outside through their control file, and, under
Ray (slow), by the elastic policy.
"""

import csv
import dataclasses
import math
import os

import pytest

from agents import dqn
from gorila_jax.distributed import launchers, placement, program
from gorila_jax.health import monitor
from gorila_jax.health import supervisor as supervisor_lib
from gorila_jax.run import elastic, experiment, live_actors, tasks, wiring
from tests import fakes
from tests.gorila_jax.learning.test_checkpoint import CONFIG, SPEC, _experiment
from tests.gorila_jax.health.test_fault_nodes import (
    _RAY_SETTINGS,
    _env_steps,
    _node_status,
    _run_with,
)

# ---------------------------------------------------------------- launchers


def _producers_program() -> program.Program:
    """A counter and two producers in the "actor" group, which fill a 2-CPU Ray cluster.

    The "replay" and "actor" groups are packed into one placement group (as
    in the Gorila graph), so an added producer only fits in a bundle that a
    removed one left.
    """
    graph = program.Program("elastic")
    with graph.group("replay", program.Resources(num_cpus=1.0)):
        counter = graph.add_node(fakes.Counter)
    with graph.group("actor", program.Resources(num_cpus=0.5)):
        for index in range(2):
            graph.add_node(fakes.Producer, f"actor/{index}", counter)
    return graph


def _growing(counter, source: str, by: int = 20) -> bool:
    start = counter.sources().get(source, 0)
    return fakes.wait_until(lambda: counter.sources().get(source, 0) >= start + by, timeout_s=60)


@pytest.mark.parametrize("launcher", ["local", "ray"])
def test_nodes_added_to_and_removed_from_a_running_program(launcher, ray_options):
    options = ray_options if launcher == "ray" else {}
    with launchers.launch(_producers_program(), launcher, **options) as running:
        counter = running.client("replay")
        assert _growing(counter, "actor/0") and _growing(counter, "actor/1")
        if launcher == "ray":
            # The cluster is full: adding fails at once, naming what is missing.
            with pytest.raises(placement.UnplaceableError, match="'actor'.*CPU.*remove a node"):
                running.add_node("actor", fakes.Producer, ("actor/2", program.Handle("replay/0")))
        total_before = counter.total()
        running.remove_node("actor/0")
        stopped_at = counter.sources()["actor/0"]
        # The next unused index, never the removed node's: its name (and seed offset) stays taken.
        added = running.add_node("actor", fakes.Producer, ("actor/2", program.Handle("replay/0")))
        assert added.name == "actor/2"
        assert _growing(counter, "actor/2"), "the added node does not produce"
        assert _growing(counter, "actor/1"), "a node that stayed stopped producing"
        assert counter.sources()["actor/0"] == stopped_at, "the removed node kept producing"
        assert counter.total() > total_before
        assert [spec.name for spec in running.active_nodes("actor")] == ["actor/1", "actor/2"]
        assert running.removed_nodes == ["actor/0"]
        assert not running.failures() and not running.finished()
        if launcher == "ray":
            # An added node is restarted into the place it holds, like a launched one.
            running.restart("actor/2")
            assert _growing(counter, "actor/2"), "the restarted added node does not produce"
        with pytest.raises(ValueError, match="actor/0 was removed already"):
            running.remove_node("actor/0")
        with pytest.raises(ValueError, match="replay/0: it is used by actor/1, actor/2"):
            running.remove_node("replay/0")
        with pytest.raises(ValueError, match="no group|groups replay, actor"):
            running.add_node("learner", fakes.Counter)
    with pytest.raises(RuntimeError, match="stopped program"):
        running.add_node("actor", fakes.Counter)


# ---------------------------------------------------------------- supervisor and monitor


class _ElasticRunning:
    """A launched program whose membership, failures and restarts the test sets."""

    def __init__(self, graph: program.Program):
        self.program = graph
        self.active = [spec.name for spec in graph.nodes]
        self.failed: dict[str, str] = {}
        self.restarted: list[str] = []

    def active_nodes(self, group=None):
        return [self.program.node(name) for name in self.active]

    def failures(self) -> dict[str, str]:
        return {name: why for name, why in self.failed.items() if name in self.active}

    def is_built(self, name: str) -> bool:
        return True

    def kill(self, name: str) -> None:
        pass

    def restart(self, name: str, kwargs: dict) -> None:
        self.restarted.append(name)
        self.failed.pop(name, None)


def test_the_supervisor_watches_added_nodes_and_forgets_removed_ones():
    graph = program.Program("elastic")
    with graph.group("actor", program.Resources(num_cpus=0)):
        graph.add_node(fakes.Counter)
    graph.node("actor/0").restartable(lambda counters: {})
    running = _ElasticRunning(graph)
    monitor_node = monitor.MonitorNode()
    supervisor = supervisor_lib.Supervisor(running, monitor_node, 30.0, 0.0, max_restarts=3)
    # A node added after the supervisor started: its death is noticed and it is restarted.
    with graph.group("actor"):
        graph.add_node(fakes.Counter)
    graph.node("actor/1").restartable(lambda counters: {})
    running.active.append("actor/1")
    running.failed["actor/1"] = "ActorDiedError: killed"
    (line,) = supervisor.check()
    assert "actor/1" in line and running.restarted == ["actor/1"]
    assert supervisor.restarts == {"actor/0": 0, "actor/1": 1}
    # A removed node is never restarted, whatever its launcher says of it.
    running.active.remove("actor/0")
    running.failed["actor/0"] = "ActorDiedError: stopped"
    assert supervisor.check() == []
    assert running.restarted == ["actor/1"] and "actor/0" not in supervisor.restarts


def test_a_removed_nodes_final_counters_stay_in_the_totals():
    hub = monitor.MonitorNode()
    hub.report("actor/0", {"env_steps": 500, "episodes": 4})
    hub.report("actor/1", {"env_steps": 300, "episodes": 2})
    hub.retire("actor/1")
    # A beat still in flight from the removed actor must not move its counters back.
    hub.report("actor/1", {"env_steps": 250, "episodes": 1})
    snapshot = hub.snapshot()
    assert snapshot["env_steps"] == 800 and snapshot["episodes"] == 6
    assert set(hub.node_status()) == {"actor/0"}
    assert hub.node_counters()["actor/1"] == {"env_steps": 300, "episodes": 2}


# ---------------------------------------------------------------- the elastic policy

_POLICY = elastic.ElasticPolicy(
    interval_s=10.0,
    target_env_steps_per_s=1000.0,
    variance_threshold=0.5,
    min_actors=2,
    max_actors=4,
)


@pytest.mark.parametrize(
    "num_actors, env_steps_per_s, variance, expected",
    [
        (3, 500.0, 0.1, elastic.ADD),  # slow and steady: more data helps
        (4, 500.0, 0.1, elastic.KEEP),  # ... but max_actors reached
        (3, 1500.0, 0.1, elastic.KEEP),  # fast enough
        (3, 500.0, 0.7, elastic.KEEP),  # variance neither low nor above twice the threshold
        (3, 500.0, 1.1, elastic.REMOVE),  # variance above 2 x threshold
        (3, 1500.0, 1.1, elastic.REMOVE),  # ... whatever the throughput
        (2, 500.0, 1.1, elastic.KEEP),  # ... but min_actors reached
        (3, 500.0, float("nan"), elastic.KEEP),  # too few learner reports to judge
        (1, 1500.0, 1.1, elastic.ADD),  # below min_actors (set by hand): back inside
        (6, 500.0, 0.1, elastic.REMOVE),  # above max_actors: back inside
        (3, 500.0, 0.5, elastic.KEEP),  # exactly the threshold is not "low"
        (3, 500.0, 1.0, elastic.KEEP),  # exactly twice the threshold is not "above"
    ],
)
def test_policy_decisions(num_actors, env_steps_per_s, variance, expected):
    assert elastic.decide(num_actors, env_steps_per_s, variance, _POLICY) == expected


def test_sample_variance_needs_a_few_samples():
    assert elastic.sample_variance([1.0, 2.0, 3.0, 4.0]) == pytest.approx(5.0 / 3.0)
    assert math.isnan(elastic.sample_variance([1.0, 2.0]))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(interval_s=0.0), "elastic_interval_s must be positive"),
        (dict(target_env_steps_per_s=0.0), "elastic_target_env_steps_per_s must be positive"),
        (dict(variance_threshold=-1.0), "elastic_variance_threshold must be positive"),
        (dict(variance_metric=""), "elastic_variance_metric"),
        (dict(min_actors=0), "min_actors must be at least 1"),
        (dict(min_actors=5), r"max_actors \(4\) must not be below min_actors \(5\)"),
    ],
)
def test_bad_policy_settings_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(_POLICY, **overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_actors=5, max_actors=4), r"num_actors \(5\) must be within"),
        (dict(num_actors=1, min_actors=2), r"num_actors \(1\) must be within"),
        (dict(elastic_interval_s=-1.0), "elastic_interval_s must not be negative"),
        (dict(elastic_interval_s=30.0), "elastic_target_env_steps_per_s must be positive"),
        (dict(balance_factor=1.0), "balance_factor must be above 1"),
        (dict(balance_interval_s=-5.0), "balance_interval_s must not be negative"),
    ],
)
def test_bad_experiment_settings_are_rejected(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _experiment(tmp_path, **overrides).validate()


# ---------------------------------------------------------------- the scaler's rules


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Actors:
    """add/remove callbacks over a list of names, as the experiment's would act."""

    def __init__(self, count: int):
        self.names = [f"actor/{i}" for i in range(count)]
        self._next = count

    def add(self) -> str:
        self.names.append(f"actor/{self._next}")
        self._next += 1
        return self.names[-1]

    def remove(self, name: str) -> None:
        self.names.remove(name)

    def active(self) -> list[str]:
        return list(self.names)


def _scaler(logdir, actors: _Actors, **kwargs) -> elastic.ActorScaler:
    return elastic.ActorScaler(str(logdir), actors.add, actors.remove, actors.active, **kwargs)


def _write_control(logdir, text: str) -> None:
    path = elastic.num_actors_path(str(logdir))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _snapshot(env_steps: int, learner_steps: int = 0, **metrics) -> dict:
    return {"env_steps": env_steps, "learner_steps": learner_steps, "metrics": metrics}


def test_the_control_file_sets_the_actor_count_when_it_changes(tmp_path):
    actors = _Actors(2)
    scaler = _scaler(tmp_path, actors, max_actors=5)
    assert scaler.poll(_snapshot(0), dict) == []  # no file: nothing to do
    _write_control(tmp_path, "4\n")
    lines = scaler.poll(_snapshot(0), dict)
    assert actors.names == ["actor/0", "actor/1", "actor/2", "actor/3"]
    assert len(lines) == 2 and all("added" in line for line in lines)
    assert scaler.poll(_snapshot(0), dict) == []  # unchanged: applied once
    _write_control(tmp_path, "3")
    (line,) = scaler.poll(_snapshot(0), dict)
    assert "removed actor/3" in line, "the newest actor goes first"
    _write_control(tmp_path, "many")
    (line,) = scaler.poll(_snapshot(0), dict)
    assert "ignored" in line and "'many' is not a whole number" in line
    _write_control(tmp_path, "0")
    (line,) = scaler.poll(_snapshot(0), dict)
    assert "0 is below 1" in line and len(actors.names) == 3
    _write_control(tmp_path, "9")
    lines = scaler.poll(_snapshot(0), dict)
    assert "asks for 9 actors; using 5" in lines[0] and len(actors.names) == 5
    assert scaler.row_fields() == {"num_actors": 5}


def test_a_resize_that_fails_is_reported_and_the_run_goes_on(tmp_path):
    actors = _Actors(1)

    def cluster_full() -> str:
        raise placement.UnplaceableError("the Ray cluster has 0 CPU free")

    scaler = elastic.ActorScaler(str(tmp_path), cluster_full, actors.remove, actors.active)
    _write_control(tmp_path, "2")
    (line,) = scaler.poll(_snapshot(0), dict)
    assert "could not reach 2 actors" in line and "0 CPU free" in line
    assert actors.names == ["actor/0"]


def test_a_control_file_left_by_an_earlier_run_applies_only_when_resuming(tmp_path):
    _write_control(tmp_path, "3")
    fresh = _Actors(1)
    _scaler(tmp_path, fresh).poll(_snapshot(0), dict)
    assert len(fresh.names) == 1
    resumed = _Actors(1)
    _scaler(tmp_path, resumed, apply_existing=True).poll(_snapshot(0), dict)
    assert len(resumed.names) == 3


def test_the_policy_adds_an_actor_when_slow_and_steady_and_removes_one_when_noisy(tmp_path):
    clock, actors = _Clock(), _Actors(2)
    scaler = _scaler(tmp_path, actors, policy=_POLICY, max_actors=4, clock=clock)
    scaler.poll(_snapshot(0), dict)  # the interval starts
    # 10 s at 100 env steps/s (target 1000), grad norms varying little.
    for t, norm in enumerate([1.0, 1.1, 0.9, 1.0, 1.05], start=1):
        clock.now = 2.0 * t
        lines = scaler.poll(_snapshot(200 * t, learner_steps=t, grad_norm=norm), dict)
    assert actors.names == ["actor/0", "actor/1", "actor/2"]
    assert "added actor/2" in lines[0] and "policy" in lines[0]
    # A new interval starts with the new count: grad norms swing widely
    # (variance > 2 x 0.5) and one actor goes.
    for t, norm in enumerate([0.0, 3.0, 0.5, 4.0, 1.0, 2.5], start=6):
        clock.now = 2.0 * t
        lines = scaler.poll(_snapshot(200 * t, learner_steps=t, grad_norm=norm), dict)
    assert actors.names == ["actor/0", "actor/1"] and "removed actor/2" in lines[0]


def test_the_policy_names_the_metrics_it_could_use_when_its_metric_is_missing(tmp_path):
    clock, actors = _Clock(), _Actors(2)
    scaler = _scaler(tmp_path, actors, policy=_POLICY, clock=clock)
    scaler.poll(_snapshot(0), dict)
    clock.now = 11.0
    (line,) = scaler.poll(_snapshot(100, learner_steps=5, loss=0.3, q_mean=1.0), dict)
    assert "no metric 'grad_norm'" in line and "loss, q_mean" in line
    assert len(actors.names) == 2


# ---------------------------------------------------------------- a real run, resized from outside


def _csv_column(logdir, column: str) -> list[float]:
    with open(os.path.join(logdir, "metrics.csv")) as f:
        return [float(row[column]) for row in csv.DictReader(f) if row.get(column)]


def _changes(values: list[float]) -> list[float]:
    """`values` without repeats in a row: the actor counts a run went through."""
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


@pytest.mark.parametrize(
    "mode",
    ["sync", "gorila", pytest.param("ray_policy", marks=[pytest.mark.slow, pytest.mark.extended])],
)
def test_the_control_file_adds_and_removes_actors_of_a_running_experiment(
    mode, tmp_path, ray_options
):
    """sync and gorila (local launcher): the control file adds actor/1, then removes it.

    ray_policy (the ray launcher, sync mode): the elastic policy adds actor/1
    (throughput far under its target, gradient-norm variance far under its
    threshold, max_actors=2); the control file removes it; the policy adds
    actor/2 in its place.
    """
    by_policy = mode == "ray_policy"
    settings = dict(_RAY_SETTINGS) if by_policy else {"launcher": "local"}
    if mode == "gorila":
        settings.update(learner_mode="gorila", num_learners=1, num_ps_shards=2)
    if by_policy:
        settings.update(
            max_actors=2,
            elastic_interval_s=2.0,
            elastic_target_env_steps_per_s=1e9,
            elastic_variance_threshold=1e9,
        )
    settings.update(
        num_actors=1,
        total_env_steps=10**9,
        eval_interval_s=0.0,
        checkpoint_interval_steps=0,
        log_interval_s=0.5,
        heartbeat_interval_s=0.5,
    )
    cfg = _experiment(tmp_path, **settings)

    def resize():
        grow = lambda node, above: fakes.wait_until(  # noqa: E731
            lambda: _env_steps(tmp_path, node) > above, timeout_s=120
        )
        assert grow("actor/0", 200), "actor/0 never acted"
        if not by_policy:
            _write_control(tmp_path, "2")
        assert grow("actor/1", 200), "the added actor/1 does not act"
        assert fakes.wait_until(
            lambda: _node_status(tmp_path)["actor/1"]["counters"]["param_version"] > 0,
            timeout_s=120,
        ), "the added actor/1 never acted with the learner's parameters"
        _write_control(tmp_path, "1")
        assert fakes.wait_until(
            lambda: _node_status(tmp_path).get("actor/1", {}).get("removed"), timeout_s=120
        ), "actor/1 was not removed"
        final = _env_steps(tmp_path, "actor/1")
        assert grow("actor/0", _env_steps(tmp_path, "actor/0") + 300), "actor/0 stopped acting"
        if by_policy:
            assert grow("actor/2", 200), "the policy did not add an actor after the removal"
        return {"final": final, "later": _env_steps(tmp_path, "actor/1")}

    summary, seen = _run_with(dqn.DQNBuilder(CONFIG), cfg, ray_options if by_policy else {}, resize)
    assert seen["final"] > 200 and seen["later"] == seen["final"], "the removed actor kept acting"
    env_steps = _csv_column(tmp_path, "env_steps")
    assert env_steps == sorted(env_steps), "env steps went backwards"
    assert summary["env_steps"] >= env_steps[-1]
    counts = _changes(_csv_column(tmp_path, "num_actors"))
    assert counts == ([1, 2, 1, 2] if by_policy else [1, 2, 1])
    assert summary["restarts"] == []


class _Unlaunched:
    """A program that is not launched: enough for wiring an added actor."""

    def __init__(self, graph: program.Program):
        self.program = graph

    def active_nodes(self, group=None):
        return self.program.groups.get(group, []) if group else self.program.nodes


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(learner_mode="gorila", num_learners=1, num_ps_shards=2),
        dict(param_cache_per_host=True, actors_per_host=1),
    ],
    ids=["sync", "gorila", "param_cache"],
)
def test_an_added_actor_is_wired_like_the_launched_ones(tmp_path, settings):
    cfg = _experiment(tmp_path, num_actors=2, **settings)
    builder = dqn.DQNBuilder(CONFIG)
    graph = experiment.make_program(builder, cfg, SPEC)
    first = graph.node("actor/0")
    args, kwargs = wiring.actor_arguments(
        builder, cfg, SPEC, 0, live_actors.actor_sources(_Unlaunched(graph)), None
    )
    # Rebuilt for index 0, an added actor's arguments are actor/0's own.
    assert args == first.args and kwargs == first.kwargs


class _Resizable(_Unlaunched):
    """An unlaunched program whose actors are removed by hand: enough for `remove_actor`."""

    def __init__(self, graph: program.Program):
        super().__init__(graph)
        self.removed_nodes: list[str] = []
        self.monitor = monitor.MonitorNode()

    def active_nodes(self, group=None):
        return [s for s in super().active_nodes(group) if s.name not in self.removed_nodes]

    def remove_node(self, name: str) -> None:
        self.removed_nodes.append(name)

    def client(self, name: str):
        return self.monitor


def test_removing_actors_never_leaves_a_replay_shard_without_a_writer(tmp_path):
    policy_on = dict(
        elastic_interval_s=5.0, elastic_target_env_steps_per_s=100.0, elastic_variance_threshold=1.0
    )
    cfg = _experiment(tmp_path, num_actors=4, num_replay_shards=2, **policy_on)
    # min_actors=1 is raised to the shard count, for the control file and the policy alike.
    assert cfg.min_actors == 1 and cfg.actor_count_floor == 2
    assert cfg.elastic_policy.min_actors == 2
    builder = dqn.DQNBuilder(CONFIG)
    running = _Resizable(experiment.make_program(builder, cfg, SPEC))
    # actor/1 and actor/3 write to shard 1 (i % 2): one of them may go, not both.
    live_actors.remove_actor(running, "actor/1")
    with pytest.raises(ValueError, match="actor/3: it is the last actor writing to replay shard 1"):
        live_actors.remove_actor(running, "actor/3")
    assert running.removed_nodes == ["actor/1"]
    scaler = tasks.OneTask(builder, cfg).actor_scaler(running)
    _write_control(tmp_path, "1")
    lines = scaler.poll(_snapshot(0), dict)
    assert "asks for 1 actors; using 2" in lines[0]
    # The newest, actor/3, is shard 1's last writer: the next newest goes instead.
    assert "removed actor/2" in lines[1] and len(lines) == 2
    assert [s.name for s in running.active_nodes("actor")] == ["actor/0", "actor/3"]
