"""The table of settings that do not combine refuses each of them, and nothing else."""

import dataclasses

import pytest

from agents import dqn
from gorila_jax.run import combinations, experiment

# Settings that ask for each feature of the table.
ASKING = {
    "resume": dict(resume=True),
    "ray_address": dict(ray_address="127.0.0.1:6379"),
    "num_replay_shards > 1": dict(num_replay_shards=2),
    "num_learner_hosts > 1": dict(num_learner_hosts=2),
    "param_cache_per_host": dict(param_cache_per_host=True, actors_per_host=1),
    "elastic_interval_s": dict(elastic_interval_s=5.0),
    "balance_remedy=replace": dict(balance_interval_s=5.0, balance_remedy="replace"),
    "demos": dict(demos="/tmp"),
    "stop_at_eval_return": dict(stop_at_eval_return=10.0),
    "learner_mode=federated": dict(learner_mode="federated"),
    "launcher=launchpad": dict(launcher="launchpad"),
    "launcher=local": dict(launcher="local"),
    "num_learner_devices above 1 with launcher=local": dict(
        launcher="local", num_learner_devices=2
    ),
    "max_nonfinite_steps, rollback_lr_factor or rollback_param_noise off its default": dict(
        rollback_lr_factor=0.25
    ),
    "env_threads_per_actor above 1": dict(env_threads_per_actor=2),
    "learner_mode=gorila": dict(learner_mode="gorila"),
    "replay_backend=reverb, replay_port or a replay_cold setting": dict(replay_port=5000),
}
# Settings that make each kind of run.
KIND_OF = {
    "num_learner_hosts > 1": dict(num_learner_hosts=2),
    "learner_mode=gorila": dict(learner_mode="gorila"),
    "launcher=launchpad": dict(launcher="launchpad"),
    "learner_mode=federated": dict(learner_mode="federated"),
    "an env without a thread pool (`mpe/`, `gym:` ids)": dict(env_id="gym:CartPole-v1"),
    "a multi-agent env of several roles (role groups)": dict(env_id="mpe/simple_tag_v3"),
    "launcher=anakin": dict(launcher="anakin", env_id="gymnax/CartPole-v1"),
}
PLAIN = dict(env_id="CartPole-v1", launcher="ray", learner_mode="sync")


def test_every_feature_a_kind_refuses_is_one_the_table_knows_how_to_ask():
    known = set(combinations.SETTING_FEATURES) | set(combinations.AGENT_FEATURES)
    for kind in combinations.KINDS:
        assert set(kind.refuses) <= known, kind.name
    assert set(ASKING) == set(combinations.SETTING_FEATURES), "an example for each feature"
    assert set(KIND_OF) == {kind.name for kind in combinations.KINDS}


@pytest.mark.parametrize("kind", combinations.KINDS, ids=lambda kind: kind.name)
def test_each_kind_refuses_each_setting_it_cannot_have_naming_it(kind):
    for feature in kind.refuses:
        if feature not in combinations.SETTING_FEATURES:
            continue
        cfg = experiment.ExperimentConfig(**{**PLAIN, **KIND_OF[kind.name], **ASKING[feature]})
        with pytest.raises(ValueError, match=f"{feature}") as caught:
            combinations.check_settings(cfg)
        assert str(caught.value) == kind.refusal.format(
            **vars(cfg),
            asked=feature,
            roles="adversary, agent" if "roles" in kind.refusal else "",
        )


def test_a_plain_run_refuses_none_of_them():
    for feature, settings in ASKING.items():
        if feature in ("learner_mode=federated", "launcher=launchpad"):
            continue  # those make kinds of their own
        combinations.check_settings(experiment.ExperimentConfig(**{**PLAIN, **settings}))


@pytest.mark.parametrize("env_id", ["gym:Acrobot-v1", "mpe/simple_spread_v3", "mpe/simple_tag_v3"])
def test_envs_without_a_thread_pool_refuse_more_than_one_env_thread(env_id):
    # Their envs step in the actor's thread; a second thread would be asked for and unused.
    cfg = experiment.ExperimentConfig(**{**PLAIN, "env_id": env_id, "env_threads_per_actor": 2})
    with pytest.raises(ValueError, match="steps in the actor's own thread.*--num_actors"):
        combinations.check_settings(cfg)
    combinations.check_settings(dataclasses.replace(cfg, env_threads_per_actor=1))


@pytest.mark.parametrize("setting", [dict(max_nonfinite_steps=0), dict(rollback_param_noise=0.01)])
def test_a_gorila_run_refuses_each_rollback_setting_it_would_ignore(setting):
    cfg = experiment.ExperimentConfig(**{**PLAIN, "learner_mode": "gorila", **setting})
    with pytest.raises(ValueError, match="nothing to roll back"):
        combinations.check_settings(cfg)
    combinations.check_settings(experiment.ExperimentConfig(**{**PLAIN, **setting}))  # sync


@pytest.mark.parametrize("setting", [dict(max_nonfinite_steps=5), dict(rollback_lr_factor=0.1)])
def test_a_federated_run_refuses_the_rollback_settings_its_clients_would_ignore(setting):
    # A client never rolls back: a rollback would bring back its parameters of an older
    # round (gorila_jax/run/learning_modes.py).
    cfg = experiment.ExperimentConfig(**{**PLAIN, **KIND_OF["learner_mode=federated"], **setting})
    with pytest.raises(ValueError, match="federated does not support max_nonfinite_steps"):
        combinations.check_settings(cfg)


def test_an_agent_with_a_tiered_replay_is_refused_by_federated_runs_and_role_groups(tmp_path):
    tiered = dqn.DQNBuilder(dataclasses.replace(dqn.DQNConfig(), hot_replay_size=100_000))
    plain = dqn.DQNBuilder(dqn.DQNConfig())
    federated = experiment.ExperimentConfig(**{**PLAIN, **KIND_OF["learner_mode=federated"]})
    with pytest.raises(ValueError, match="federated does not support a tiered replay yet"):
        combinations.check_agents(federated, [tiered])
    combinations.check_agents(federated, [plain])
    roles = experiment.ExperimentConfig(env_id="mpe/simple_tag_v3", logdir=str(tmp_path))
    with pytest.raises(ValueError, match="role groups does not support a tiered replay yet"):
        combinations.check_agents(roles, [plain, tiered])
    # Through the run's own check, as launch.train makes it.
    with pytest.raises(ValueError, match="does not support a tiered replay yet"):
        experiment.check_run(
            tiered,
            dataclasses.replace(federated, logdir=str(tmp_path), num_actors=2, launcher="local"),
        )
