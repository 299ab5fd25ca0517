"""Role groups (docs/multiagent.md): a task of several roles runs one replay and one learner
per role; actors step the shared environment and send each role's transitions to its own
replay; metrics, evaluations, checkpoints and restarts are per role."""

import csv
import dataclasses
import json
import os
import signal

import pytest

from agents import dqn, ppo
from gorila_jax import curves, metrics, multiagent
from gorila_jax.distributed import program as program_lib
from gorila_jax.gorila import shard_node
from gorila_jax.health import monitor as monitor_lib
from gorila_jax.learning import checkpoint
from gorila_jax.learning import config_record
from gorila_jax.run import experiment, resume, role_program
from launch import presets, sweep, sweep_runs
from tests import fakes
from tests.launch import test_train_cli
from tests.gorila_jax.health.test_fault_nodes import (
    _RAY_SETTINGS,
    _START_UP_TIMEOUT_S,
    _node_status,
    _run_with,
)

TAG = "mpe/simple_tag_v3"  # 3 predators ("adversary") chase 1 prey ("agent")


def _ppo_builders(num_actors: int = 1) -> dict:
    """The mpe preset's PPO for each role (the config sizes its KL report by the actors)."""
    builders = {}
    for role, spec in multiagent.role_specs(TAG).items():
        config, _ = presets.load("auto", "ppo", TAG, set(), spec=spec)
        builders[role] = ppo.PPOBuilder(dataclasses.replace(config, num_actors=num_actors))
    return builders


def _dqn_gorila_builders() -> dict:
    """DQN's Gorila preset for each role, with a replay that fills within seconds."""
    builders = {}
    for role, spec in multiagent.role_specs(TAG).items():
        config, _ = presets.load("auto", "dqn", TAG, set(), "gorila", spec=spec)
        builders[role] = dqn.DQNBuilder(dataclasses.replace(config, min_replay_size=200))
    return builders


def _experiment(logdir, **overrides) -> experiment.ExperimentConfig:
    settings = dict(
        env_id=TAG,
        launcher="local",
        logdir=str(logdir),
        num_actors=1,
        num_envs_per_actor=8,
        eval_episodes=4,
        eval_interval_s=1.0,
        log_interval_s=0.5,
    )
    return experiment.ExperimentConfig(**{**settings, **overrides})


def test_each_role_has_its_own_replay_and_learner_and_shares_actors_and_monitor(tmp_path):
    builders = _ppo_builders()
    program = experiment.make_program(builders, _experiment(tmp_path))
    assert set(program.groups) == {
        "monitor",
        "replay@adversary",
        "learner@adversary",
        "replay@agent",
        "learner@agent",
        "evaluator",
        "actor",
    }
    for role in ("adversary", "agent"):
        learner = program.node(f"learner@{role}/0")
        assert learner.kwargs["name"] == f"learner@{role}/0"  # how it reports to the monitor
        assert learner.dependencies() == {f"replay@{role}/0", "monitor/0"}
        assert learner.args[0] is builders[role]
        assert learner.args[1] == multiagent.role_specs(TAG)[role]
        assert learner.restart_kwargs is not None
        # One process (local) holds both learners: one device each, never a shared
        # set of devices that both pmap over.
        assert learner.args[5].num_devices == 1  # its LearnerSettings
        assert (
            program.node(f"replay@{role}/0")
            .kwargs["checkpoint_dir"]
            .startswith(os.path.join(os.path.abspath(tmp_path), "roles", role))
        )
    actor = program.node("actor/0")
    assert actor.dependencies() == {
        "replay@adversary/0",
        "learner@adversary/0",
        "replay@agent/0",
        "learner@agent/0",
        "monitor/0",
    }


def test_in_gorila_mode_each_roles_workers_push_to_that_roles_shards_only(tmp_path):
    cfg = _experiment(tmp_path, learner_mode="gorila", num_learners=2, num_ps_shards=2)
    program = experiment.make_program(_dqn_gorila_builders(), cfg)
    for role in ("adversary", "agent"):
        shards = {f"parameter_server@{role}/0", f"parameter_server@{role}/1"}
        assert {spec.name for spec in program.groups[f"parameter_server@{role}"]} == shards
        for index in (0, 1):
            worker = program.node(f"gradient_worker@{role}/{index}")
            assert worker.kwargs["group"] == f"gradient_worker@{role}"  # its monitor name
            assert worker.dependencies() == shards | {f"replay@{role}/0", "monitor/0"}
    # The evaluator and actors read each role's parameters from that role's shards.
    reads = program.node("actor/0").dependencies() & program.node("evaluator/0").dependencies()
    assert {name for name in reads if name.startswith("parameter_server")} == {
        f"parameter_server@{role}/{i}" for role in ("adversary", "agent") for i in (0, 1)
    }


@pytest.mark.slow
def test_a_gorila_run_of_two_roles_applies_each_roles_gradients_on_its_own_shards(tmp_path):
    """DQN predators and prey in Gorila mode: each role's shards apply gradients, and the
    parameters they assemble to are that role's network (16 or 14 inputs): a gradient of
    the other role's network could not have been applied to them."""
    builders = _dqn_gorila_builders()
    cfg = _experiment(
        tmp_path,
        learner_mode="gorila",
        num_learners=1,
        num_ps_shards=2,
        total_env_steps=6_000,
        checkpoint_interval_steps=10_000,
    )
    summary = experiment.run_experiment(builders, cfg)
    with open(tmp_path / "metrics.csv") as f:
        last = list(csv.DictReader(f))[-1]
    # The progress line has each role's shard updates too.
    rows, _ = metrics.read_csv(str(tmp_path / "metrics.csv"), float("inf"))
    line = role_program.progress_suffix(rows[-1], ("adversary", "agent"))
    assert line.count(" applied ") == 2, line
    for role, spec in multiagent.role_specs(TAG).items():
        assert float(last[f"{role}/gradients_applied"]) > 0, last
        for shard in (0, 1):
            assert float(last[f"{role}/shard{shard}/applied"]) > 0, last
        assert summary["params_version"][role] > 0
        assert summary["roles"][role]["final_eval_episodes"] == cfg.eval_episodes
        # The role's Gorila checkpoint (its shards' state) restores into that role's
        # network and not into the other role's.
        role_dir = checkpoint.role_logdir(str(tmp_path), role)
        other = "agent" if role == "adversary" else "adversary"
        other_spec = multiagent.role_specs(TAG)[other]
        own = shard_node.checkpoint_template(builders[role], spec, cfg.seed, cfg.num_ps_shards)
        assert checkpoint.restore_newest(role_dir, own).step > 0
        foreign = shard_node.checkpoint_template(
            builders[other], other_spec, cfg.seed, cfg.num_ps_shards
        )
        with pytest.raises(checkpoint.CheckpointError):
            checkpoint.restore_newest(role_dir, foreign)


def test_the_monitor_keeps_each_roles_figures_apart():
    monitor = monitor_lib.MonitorNode(return_window=10, roles=("adversary", "agent"))
    monitor.report("learner@adversary/0", {"learner_steps": 7}, metrics={"loss": 1.5})
    monitor.report("learner@agent/0", {"learner_steps": 2}, metrics={"loss": 0.5})
    counters = {"env_steps": 40, "env_steps@adversary": 30, "env_steps@agent": 10}
    monitor.report("actor/0", counters, role_returns={"adversary": [10.0, 20.0], "agent": [-5.0]})
    monitor.report_eval([30.0, 10.0], param_version=7, role="adversary")
    snapshot = monitor.snapshot()
    assert snapshot["learner_steps"] == 9 and snapshot["env_steps"] == 40
    assert snapshot["metrics"] == {"adversary/loss": 1.5, "agent/loss": 0.5}
    assert snapshot["roles"]["adversary"] == {
        "env_steps": 30,
        "episodes": 0,
        "learner_steps": 7,
        "mean_return": 15.0,
        "eval_return": 20.0,
    }
    agent = snapshot["roles"]["agent"]
    assert agent["learner_steps"] == 2 and agent["mean_return"] == -5.0
    assert agent["eval_return"] != agent["eval_return"]  # nan: not evaluated yet
    # The role's recent returns survive a checkpoint.
    restored = monitor_lib.MonitorNode(
        roles=("adversary", "agent"), restored=monitor.checkpoint_state()
    )
    assert restored.snapshot()["roles"]["adversary"]["mean_return"] == 15.0


@pytest.mark.slow
def test_a_run_of_two_roles_trains_each_on_its_own_data_and_reports_each(tmp_path):
    """PPO for predators and prey of simple_tag, to the end of a short budget: both
    learners step on their own role's rows (the replay signatures differ: 16 against 14
    observation features), and every figure exists per role."""
    cfg = _experiment(tmp_path, total_env_steps=16_000, checkpoint_interval_steps=10_000)
    summary = experiment.run_experiment(_ppo_builders(), cfg)
    roles = summary["roles"]
    assert set(roles) == {"adversary", "agent"}
    for role, figures in roles.items():
        assert figures["learner_steps"] > 0, (role, figures)
        assert figures["final_eval_episodes"] == cfg.eval_episodes
        assert isinstance(figures["final_eval_return"], float)
        assert figures["episodes"] > 0 and figures["mean_return"] == figures["mean_return"]
        assert summary["params_version"][role] > 0
    # 3 predator rows for each prey row.
    assert roles["adversary"]["env_steps"] == 3 * roles["agent"]["env_steps"]
    assert summary["env_steps"] == roles["adversary"]["env_steps"] + roles["agent"]["env_steps"]
    evaluated = {e["role"] for e in summary["evaluations"]}
    assert evaluated == {"adversary", "agent"}
    with open(tmp_path / "metrics.csv") as f:
        columns = set(next(csv.reader(f)))
    for role in ("adversary", "agent"):
        assert {f"{role}/mean_return", f"{role}/eval_return", f"{role}/learner_steps"} <= columns
        assert f"{role}/loss" in columns  # each learner's metrics under its role
        # Each role's own config and final checkpoint.
        role_dir = checkpoint.role_logdir(str(tmp_path), role)
        assert checkpoint.saved_steps(role_dir) == [summary["params_version"][role]]
        assert os.path.exists(os.path.join(role_dir, config_record.CONFIG_FILE))
        # Sweeps and plots read the run as one role's.
        run = sweep_runs.Run("base", 0, str(tmp_path), [])
        sweep_runs.read_result(run, summary, threshold=-1e9, role=role)
        assert run.final_return == roles[role]["final_eval_return"]
        assert run.threshold["reached"]
        curve = curves.read_run(str(tmp_path), role)
        assert curve.evaluations[-1]["eval_return"] == roles[role]["final_eval_return"]
        assert curves.series(curve, "mean_return", "env_steps") is not None
    with pytest.raises(ValueError, match="no role 'prey': its roles are adversary, agent"):
        sweep_runs.read_result(run, summary, threshold=None, role="prey")
    assert (tmp_path / "curves.png").exists()


@pytest.mark.slow
def test_a_stopped_run_of_two_roles_resumes_each_role_from_its_own_checkpoint(tmp_path):
    builders = _ppo_builders()
    first = experiment.run_experiment(
        builders, _experiment(tmp_path, total_env_steps=8_000, checkpoint_interval_steps=10_000)
    )
    resumed = experiment.run_experiment(
        builders,
        _experiment(
            tmp_path, total_env_steps=16_000, checkpoint_interval_steps=10_000, resume=True
        ),
    )
    assert resumed["resumed_from_learner_step"] == first["params_version"]
    for role in ("adversary", "agent"):
        before, after = first["roles"][role], resumed["roles"][role]
        # Learner steps and the role's env steps go on from the first run's.
        assert after["learner_steps"] > before["learner_steps"] > 0, (role, before, after)
        assert after["env_steps"] > before["env_steps"] > 0
        assert resumed["params_version"][role] > first["params_version"][role]
    assert resumed["env_steps"] >= 16_000
    # The evaluations of both runs, each role's, are one history.
    assert resumed["evaluations"][: len(first["evaluations"])] == first["evaluations"]


@pytest.mark.slow
# CI: a killed learner restarts from its newest checkpoint (test_fault_nodes.py) and a
# stopped run of two roles resumes each role from its own checkpoint (above).
@pytest.mark.extended
def test_a_killed_roles_learner_is_restarted_and_the_other_roles_learner_goes_on(
    tmp_path, ray_options
):
    cfg = _experiment(
        tmp_path,
        total_env_steps=10**9,
        # 2 learners, 2 replays and an actor on the test cluster's 2 CPUs.
        **{
            **_RAY_SETTINGS,
            "num_actors": 1,
            "learner_cpus": 0.25,
            "replay_cpus": 0.25,
            "checkpoint_interval_steps": 2,
            "num_learner_devices": 1,
        },
    )

    def steps(node: str) -> int:
        status = _node_status(tmp_path).get(node, {})
        return int(status.get("counters", {}).get("learner_steps", 0))

    def kill_the_prey_learner():
        prey, predators = "learner@agent/0", "learner@adversary/0"
        ready = fakes.wait_until(
            lambda: steps(prey) >= 3 and steps(predators) >= 3, timeout_s=_START_UP_TIMEOUT_S
        )
        assert ready, _node_status(tmp_path)
        killed = _node_status(tmp_path)[prey]
        os.kill(killed["pid"], signal.SIGKILL)
        at_kill = {prey: steps(prey), predators: steps(predators)}
        saved = checkpoint.saved_steps(checkpoint.role_logdir(str(tmp_path), "agent"))
        went_on = fakes.wait_until(
            lambda: (
                _node_status(tmp_path).get(prey, {}).get("pid") not in (None, killed["pid"])
                and steps(prey) >= max(saved) + 2
            ),
            timeout_s=240,
        )
        return {
            "at_kill": at_kill,
            "went_on": went_on,
            "saved": saved,
            "predators_after": steps(predators),
        }

    summary, seen = _run_with(_ppo_builders(), cfg, ray_options, kill_the_prey_learner)
    assert "error" not in seen, seen
    assert seen["went_on"], f"the prey's learner did not resume: {seen}, {_node_status(tmp_path)}"
    assert seen["saved"], "no checkpoint of the prey's learner before the kill"
    (restart,) = summary["restarts"]  # the predators' learner was never restarted
    assert restart["node"] == "learner@agent/0" and "died" in restart["reason"]
    predators = "learner@adversary/0"
    assert seen["predators_after"] > seen["at_kill"][predators]
    assert summary["roles"]["adversary"]["learner_steps"] >= seen["predators_after"]


def test_role_runs_refuse_what_they_cannot_do_yet_naming_it(tmp_path):
    builders = _ppo_builders()
    for setting, expected in [
        (dict(learner_mode="federated", num_clients=2, num_actors=2), "learner_mode=federated"),
        (dict(num_replay_shards=2, num_actors=2, demos="/nonexistent"), "demos"),
        (dict(stop_at_eval_return=10.0), "stop_at_eval_return"),
        (dict(num_learner_devices=2), "num_learner_devices above 1 with launcher=local"),
    ]:
        with pytest.raises(ValueError, match=f"several roles.*does not support {expected}"):
            experiment.check_run(builders, _experiment(tmp_path, **setting))
    # --resume looks for each role's checkpoints in its own directory.
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint in .*/roles/adversary/"):
        resume.check_resumable(_experiment(tmp_path, resume=True))
    # A role's agent that cannot do what the run asks is named with its role.
    with pytest.raises(ValueError, match="role adversary: learner_mode=gorila needs an agent"):
        role_program.check_run(builders, _experiment(tmp_path, learner_mode="gorila"))
    with pytest.raises(ValueError, match="has roles adversary, agent; got agents for adversary"):
        role_program.check_run({"adversary": builders["adversary"]}, _experiment(tmp_path))


def test_node_roles_come_from_group_names():
    assert program_lib.role_group("learner", "agent") == "learner@agent"
    assert program_lib.role_group("learner", None) == "learner"
    assert program_lib.node_role("replay@adversary/1") == "adversary"
    assert program_lib.node_role("actor/0") is None


def test_a_sweep_asked_for_a_role_its_task_lacks_is_refused_before_it_runs():
    flags = [f"--env={TAG}", "--agent=ppo"]
    assert sweep.declared_cpus(flags, role="agent") > 0
    with pytest.raises(sweep.SweepError, match="--role=prey: .* its roles are adversary, agent"):
        sweep.declared_cpus(flags, role="prey")
    with pytest.raises(sweep.SweepError, match="--role=agent: .*CartPole-v1 has no such role"):
        sweep.declared_cpus(["--env=CartPole-v1"], role="agent")


@pytest.mark.slow
def test_the_cli_trains_roles_with_different_agents(tmp_path):
    """`--role_agents`: DQN predators and PPO prey in one run, through launch.train."""
    result = test_train_cli._train(
        str(tmp_path),
        f"--env={TAG}",
        "--agent=ppo",
        "--role_agents=adversary=dqn",
        "--launcher=local",
        "--num_actors=1",
        "--total_env_steps=12000",
        "--config.learning_rate=7e-4",  # --agent's (PPO's) field: the prey's only
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "final greedy return per agent adversary" in result.stdout
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    configs = summary["agent_config"]
    assert "target_update_period" in configs["adversary"]  # DQN's
    assert "clip_epsilon" in configs["agent"]  # PPO's
    assert configs["agent"]["learning_rate"] == 7e-4
    assert configs["adversary"]["learning_rate"] == 1e-3  # DQN's mpe preset's
    for role in ("adversary", "agent"):
        assert summary["roles"][role]["learner_steps"] > 0, summary["roles"]
