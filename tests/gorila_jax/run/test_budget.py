"""A run ends at its env-step budget: within one actor step per actor of
`--total_env_steps`, not a driver poll after it (`gorila_jax/run/budget.py`)."""

import concurrent.futures
import dataclasses
import logging
import threading
import time

import pytest

from agents import dqn, ppo
from gorila_jax.acting import actor
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.run import budget, experiment
from tests.gorila_jax.learning.test_checkpoint import CONFIG, _experiment


@pytest.mark.parametrize(
    "agent, settings",
    [
        ("dqn", {"num_actors": 2, "num_envs_per_actor": 8}),
        ("dqn_gorila", {"num_actors": 2, "num_envs_per_actor": 8, "learner_mode": "gorila"}),
        ("ppo", {"num_actors": 2, "num_envs_per_actor": 8}),
    ],
)
def test_a_run_ends_within_one_actor_step_per_actor_of_its_budget(tmp_path, agent, settings):
    builder = ppo.PPOBuilder(ppo.PPOConfig()) if agent == "ppo" else dqn.DQNBuilder(CONFIG)
    total = 6_000 if agent == "ppo" else 3_000
    cfg = _experiment(tmp_path, total_env_steps=total, **settings)
    summary = experiment.run_experiment(builder, cfg)
    # Before limits, runs of 4,000 ended at 5,798 and 7,587 (a poll and a report late).
    one_step_each = settings["num_actors"] * settings["num_envs_per_actor"]
    assert total <= summary["env_steps"] < total + one_step_each, summary["env_steps"]
    assert summary["stop_reason"] == "total_env_steps reached"


class _Actor:
    """An actor's client as the budget sees it: its count now, the limit it was given."""

    def __init__(self, env_steps: int):
        self.env_steps, self.limit = env_steps, None
        self.futures = self

    def env_steps_now(self) -> concurrent.futures.Future:
        done = concurrent.futures.Future()
        done.set_result(self.env_steps)
        return done

    def limit_env_steps(self, limit: int, issued: int) -> None:
        self.limit = limit


def test_limits_add_up_to_the_budget_with_the_steps_of_removed_actors_counted():
    actors = {"actor/0": _Actor(400), "actor/2": _Actor(250)}
    # The monitor lags the actors; actor/1 was removed after 300 env steps.
    reported = {"actor/0": {"env_steps": 380}, "actor/1": {"env_steps": 300}, "learner/0": {}}
    keeper = budget.EnvStepBudget(1_000, lambda: list(actors.items()), lambda: reported)
    keeper.poll(880)  # no rate yet: limits already
    keeper.poll(900)  # 100 to go, under ENDGAME_S seconds at any rate: limits
    # 1,000 - 300 (removed) - 400 - 250 = 50 left: 25 each, from each one's count now.
    assert actors["actor/0"].limit == 425 and actors["actor/2"].limit == 275
    # Before a rate is known the whole budget is shared out; once the rate shows the end
    # is far, the limit is lifted, and no actor is asked anything more until the endgame.
    far = {"actor/0": _Actor(10)}
    keeper = budget.EnvStepBudget(10**9, lambda: list(far.items()), lambda: {})
    keeper.poll(0)  # the monitor has no counts yet
    assert far["actor/0"].limit == 10**9
    time.sleep(0.05)
    keeper.poll(10)  # 200 env steps/s
    assert far["actor/0"].limit is None
    far["actor/0"].limit = "not asked"
    time.sleep(0.05)
    keeper.poll(20)
    assert far["actor/0"].limit == "not asked"


def test_an_actor_that_stood_still_below_its_limit_gets_no_more_and_the_others_fill_it():
    hung, moving = _Actor(400), _Actor(400)
    actors = {"actor/0": hung, "actor/1": moving}
    # Standing still for 0.2 s, not budget.STILL_S, counts here.
    keeper = budget.EnvStepBudget(1_001, lambda: list(actors.items()), lambda: {}, still_s=0.2)
    keeper.poll(790)
    keeper.poll(800)  # the endgame: 201 to go, shared 101 and 100
    assert (hung.limit, moving.limit) == (501, 500)
    # A moment standing still is not a hang: actor/0 keeps a share of what is left.
    moving.env_steps = moving.limit
    keeper.poll(hung.env_steps + moving.env_steps)
    assert (hung.limit, moving.limit) == (451, 550)
    time.sleep(0.25)
    for _ in range(3):  # actor/0 hangs; actor/1 reaches each limit it is given
        moving.env_steps = moving.limit
        keeper.poll(hung.env_steps + moving.env_steps)
    # What actor/0 would never act went to actor/1: the limits add up to the budget.
    assert hung.limit == 400 and hung.limit + moving.limit == 1_001
    # Once actor/0 moves again, it shares in what is left.
    hung.env_steps = 401
    moving.env_steps = moving.limit - 10
    keeper.poll(hung.env_steps + moving.env_steps)
    assert hung.limit > 401 and hung.limit + moving.limit == 1_001


_RELEASE = threading.Event()  # set by the test: a hung actor's thread cannot be killed


@dataclasses.dataclass(frozen=True)
class _HangingActorBuilder(dqn.DQNBuilder):
    """DQN whose actor/0 hangs in its policy after 400 of its env steps, until released."""

    def make_policy(self, spec, actor_index, num_actors, evaluation):
        act = super().make_policy(spec, actor_index, num_actors, evaluation)
        if evaluation or actor_index != 0:
            return act

        def policy(params, observation, key, env_steps):
            if env_steps >= 400:
                _RELEASE.wait()
            return act(params, observation, key, env_steps)

        return policy


class _ReleaseWhenLeftBehind(logging.Handler):
    def emit(self, record):
        if "did not stop" in record.getMessage():
            self.said = record.getMessage()
            _RELEASE.set()


def test_a_hung_actor_neither_holds_the_run_short_of_its_budget_nor_stops_its_end(tmp_path):
    """With stall_timeout_s off nobody replaces a hung actor: the others act its share,
    and the run's stop goes on without it after a heartbeat timeout."""
    _RELEASE.clear()
    # Without the bound the stop would wait for good: released late, the test fails.
    watchdog = threading.Timer(240.0, _RELEASE.set)
    watchdog.start()
    handler = _ReleaseWhenLeftBehind()
    logging.getLogger().addHandler(handler)
    total = 3_000
    cfg = _experiment(
        tmp_path,
        total_env_steps=total,
        num_actors=2,
        eval_interval_s=0.0,
        stall_timeout_s=0.0,
        heartbeat_interval_s=0.5,
        heartbeat_timeout_s=3.0,
    )
    try:
        summary = experiment.run_experiment(_HangingActorBuilder(CONFIG), cfg)
    finally:
        logging.getLogger().removeHandler(handler)
        watchdog.cancel()
        _RELEASE.set()
    assert getattr(handler, "said", "") == (
        "actor/0 did not stop within 3 s (hung?); the run ends without it"
    )
    assert summary["stop_reason"] == "total_env_steps reached"
    assert total <= summary["env_steps"] < total + 2 * 4, summary["env_steps"]
    assert summary["learner_steps"] > 0 and "problem" not in summary


def test_a_limit_that_arrives_after_a_later_one_is_dropped():
    # Calls to a Ray actor run on several threads: two limits may land out of order.
    node = actor.LimitedActing(ActorSettings())
    node.env_steps_now = lambda: 200
    node.sleep = lambda seconds: None
    node.limit_env_steps(150, issued=2)
    node.limit_env_steps(300, issued=1)  # the earlier share-out's, late
    assert node.at_env_step_limit()
    node.limit_env_steps(250, issued=3)
    assert not node.at_env_step_limit()


@pytest.mark.parametrize("cap, spent", [(0, False), (199, True), (200, True), (201, False)])
def test_an_acting_node_ends_at_its_settings_env_step_cap(cap, spent):
    # What a bench's or a unit test's single actor runs to; 0 (every run's): no cap.
    node = actor.LimitedActing(ActorSettings(max_env_steps=cap))
    node.env_steps_now = lambda: 200
    assert node.budget_spent() == spent
