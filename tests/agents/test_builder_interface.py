"""Every registered agent fills the whole builder contract and trains through `launch.train`.

Parametrized over the agent registry `agents.registry.AGENTS`, so an agent added there is checked
here without a test edit: the skeleton drives each of them through the same
code (actor, adder, replay table, learner step, evaluation) and knows them
only through `gorila_jax.builder.AgentBuilder`.
"""

import dataclasses
import inspect
import json
import math
import subprocess
import sys

import jax
import pytest

from agents import registry
from gorila_jax import builder as builder_lib
from gorila_jax import envs

from tests import REPO

AGENT_NAMES = sorted(registry.AGENTS)
# The first of these an agent accepts is the one its smoke run uses.
SMOKE_ENVS = ("CartPole-v1", "Pendulum-v1")


def _contract() -> dict[str, inspect.Signature | None]:
    """Member name -> the protocol's signature (None for plain attributes and properties)."""
    members: dict[str, inspect.Signature | None] = {
        name: None for name in builder_lib.AgentBuilder.__annotations__
    }
    for name, member in inspect.getmembers(builder_lib.AgentBuilder):
        if name.startswith("_"):
            continue
        members[name] = inspect.signature(member) if inspect.isfunction(member) else None
    return members


def _builder(agent: str):
    return registry.AGENTS[agent].builder(registry.AGENTS[agent].config())


def test_the_contract_is_what_the_skeleton_calls():
    # The list each agent is held to below.
    assert set(_contract()) == {
        "config",
        "validate",
        "replay_layout",
        "batch_plan",
        "state_access",
        "init_train_state",
        "update_fns",
        "make_policy",
    }
    # Issue 37: at most eight; what only some agents do is a capability (below).
    assert len(_contract()) <= 8


# What each agent can do beyond the core contract (gorila_jax/builder.py's capabilities).
CAPABILITIES = {
    builder_lib.GorilaCapable: {"dqn", "qrdqn"},
    builder_lib.LearnsFromDemonstrations: {"dqn", "qrdqn", "sac"},
    builder_lib.TieredReplay: {"dqn", "qrdqn", "sac"},
    builder_lib.CountsDuplicates: {"dqn", "qrdqn"},
    builder_lib.WritesTransitions: {"dqn", "qrdqn", "sac"},
}


@pytest.mark.parametrize("capability", list(CAPABILITIES), ids=lambda c: c.__name__)
def test_each_agent_has_a_capability_whole_or_not_at_all(capability):
    members = [name for name in vars(capability) if not name.startswith("_")]
    having = set()
    for agent in AGENT_NAMES:
        builder = _builder(agent)
        present = [name for name in members if hasattr(builder, name)]
        assert present in ([], members), f"{agent} has only {present} of {capability.__name__}"
        if present:
            assert isinstance(builder, capability)
            having.add(agent)
    assert having == CAPABILITIES[capability]


@pytest.mark.parametrize("agent", AGENT_NAMES)
def test_builder_implements_the_whole_contract(agent):
    builder = _builder(agent)
    for name, signature in _contract().items():
        assert hasattr(builder, name), f"{agent} builder lacks {name}"
        if signature is not None:
            expected = [p for p in signature.parameters if p != "self"]
            actual = list(inspect.signature(getattr(builder, name)).parameters)
            assert actual == expected, f"{agent}.{name}{actual}: the skeleton calls it {expected}"
    assert registry.AGENTS[agent].preset_names, f"{agent} has no presets for --preset"
    spec = _smoke_spec(agent)
    fns = builder.update_fns(spec)
    # Either one gradient (Gorila-capable) or a whole step: the learner runs one or the other.
    assert fns.update is not None or (fns.compute_grads and fns.apply_grads)
    # The grouped members agree with themselves: the sampled table is one of the declared
    # ones and holds items of the codec's size; the batch plan starts where its schedule
    # does; the state's trainable parameters go back in unchanged.
    layout = builder.replay_layout(spec)
    sampled = {table.name: table for table in layout.tables}[layout.sample_table]
    assert sampled.item_bytes == layout.codec.num_bytes
    plan = builder.batch_plan
    assert plan.batch_size == plan.batch_size_at(0) > 0 and plan.updates_per_dispatch >= 1
    assert plan.first_update_after[0] > 0 and plan.first_update_after[1]
    state = builder.init_train_state(jax.random.PRNGKey(0), spec)
    access = builder.state_access
    trained = access.trainable_params(state)
    same = access.trainable_params(access.with_trainable_params(state, trained))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), trained, same))
    assert jax.tree.leaves(access.actor_params(state))


def _smoke_spec(agent: str):
    builder = _builder(agent)
    for env_id in SMOKE_ENVS:
        spec = envs.env_spec(env_id)
        try:
            builder.validate(1, spec)
        except ValueError:
            continue
        return spec
    raise AssertionError(f"{agent} accepts none of {SMOKE_ENVS}")


@pytest.mark.slow
@pytest.mark.parametrize("agent", AGENT_NAMES)
def test_agent_trains_through_the_launch_train_entry_point(agent, tmp_path):
    env_id = _smoke_spec(agent).env_id
    # Every agent's queue or rate limiter holds its actors until the learner
    # samples, so within the budget the learner has updated. SAC's Pendulum
    # preset updates once per env step after 1000, so it gets fewer steps.
    total_env_steps = 1_500 if agent == "sac" else 4_000
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.train",
            f"--agent={agent}",
            f"--env={env_id}",
            "--launcher=local",
            f"--total_env_steps={total_env_steps}",
            "--num_learner_devices=1",
            "--eval_interval_s=0",
            "--eval_episodes=2",
            "--checkpoint_interval_steps=0",
            f"--logdir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_id"] == env_id and summary["stop_reason"] == "total_env_steps reached"
    assert summary["learner_steps"] > 0 and summary["params_version"] > 0
    assert summary["final_eval_episodes"] == 2 and math.isfinite(summary["final_eval_return"])
    config_fields = {f.name for f in dataclasses.fields(registry.AGENTS[agent].config)}
    assert set(summary["agent_config"]) == config_fields  # the agent's preset config ran
