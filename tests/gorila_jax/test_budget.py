"""A run ends at its env-step budget: within one actor step per actor of
`--total_env_steps`, not a driver poll after it (`gorila_jax/run/budget.py`)."""

import concurrent.futures
import time

import pytest

from agents import dqn, ppo
from gorila_jax.run import budget, experiment
from tests.gorila_jax.test_checkpoint import CONFIG, _experiment


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

    def limit_env_steps(self, limit: int) -> None:
        self.limit = limit


def test_limits_add_up_to_the_budget_with_the_steps_of_removed_actors_counted():
    actors = {"actor/0": _Actor(400), "actor/2": _Actor(250)}
    # The monitor lags the actors; actor/1 was removed after 300 env steps.
    reported = {"actor/0": {"env_steps": 380}, "actor/1": {"env_steps": 300}, "learner/0": {}}
    keeper = budget.EnvStepBudget(1_000, lambda: list(actors.items()), lambda: reported)
    keeper.poll(880)  # the first poll only measures the rate
    keeper.poll(900)  # 100 to go, under ENDGAME_S seconds at any rate: limits
    # 1,000 - 300 (removed) - 400 - 250 = 50 left: 25 each, from each one's count now.
    assert actors["actor/0"].limit == 425 and actors["actor/2"].limit == 275
    # Far from the end, no actor is asked anything.
    far = {"actor/0": _Actor(10)}
    keeper = budget.EnvStepBudget(10**9, lambda: list(far.items()), lambda: {})
    keeper.poll(10)
    time.sleep(0.05)  # 200 env steps/s
    keeper.poll(20)
    assert far["actor/0"].limit is None
