"""`python -m launch.train` with bad input: one error line, non-zero exit, nothing left running."""

import concurrent.futures
import dataclasses
import json
import os
import re
import resource
import subprocess
import sys
from typing import Callable

import envpool
import psutil
import pytest

from agents import registry
from gorila_jax import envs, gymnax_envs, multiagent, replay
from gorila_jax.learning import checkpoint
from gorila_jax.run import experiment
from launch import listings, presets, train

from tests import REPO


def _train(logdir: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.train", *flags, f"--logdir={logdir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


# One case per path a bad input takes through the CLI (absl's flag parsing,
# the --config.<field> check, the config flag's parsing, stray arguments, the
# ValueError of a config, env, preset or mode check); the other bad values of
# each path are checked in-process below, without a 10 s process start each.
BAD_INPUTS = [
    (["--env=CartPol-v1"], "unknown env id 'CartPol-v1'; did you mean CartPole-v1"),
    (["--agent=dqnn"], "--agent"),
    (["--num_actors=0"], "--num_actors"),
    (["--config.no_such_field=1"], "no_such_field"),
    (["--config.batch_size=abc"], "batch_size"),
    (["--config.discount=1.5"], "config.discount must lie in [0, 1]"),
    (["stray_argument"], "unexpected arguments"),
    (["--preset=nosuch"], "unknown preset 'nosuch'"),
    (
        ["--num_learner_hosts=2", "--launcher=local"],
        "which launcher=ray places; it does not take launcher=local",
    ),
    (["--agent=ppo", "--learner_mode=gorila"], "learner_mode=gorila needs an agent"),
    (["--agent=sac"], "SAC cannot act in CartPole-v1"),  # the agent's action space
    (["--env=Pendulum-v1"], "DQN takes discrete actions; agents that can: ppo, sac"),
    (["--env=MiniGrid-Empty-5x5-v0"], "has dict observations (direction, image, mission)"),
    (["--demos=/nonexistent/demos", "--config.demo_fraction=0.25"], "no directory"),
    (
        ["--launcher=launchpad", "--ray_address=127.0.0.1:1"],
        "launcher=launchpad cannot do what ray_address asks",
    ),
    (["--launcher=launchpad", "--elastic_interval_s=5"], "cannot do what elastic_interval_s"),
    (["--launchpad_launch_type=nope"], "--launchpad_launch_type"),
    (  # the native replay's tables allocate at start (Reverb's grow as items come)
        ["--replay=native", "--config.max_replay_size=100000000000"],
        "the replay's tables need 4470.3 GiB",
    ),
    # Tasks of several roles (role groups, docs/multiagent.md).
    (
        ["--env=mpe/simple_tag_v3", "--agent=sac"],
        "role adversary: SAC cannot act in mpe/simple_tag_v3",
    ),
    (
        ["--env=mpe/simple_tag_v3", "--role_agents=predator=ppo"],
        "--role_agents: 'predator=ppo' is not role=agent with a role of mpe/simple_tag_v3 "
        "(adversary, agent)",
    ),
    (["--role_agents=agent=ppo"], "--role_agents is for multi-agent tasks with several roles"),
    (
        ["--env=mpe/simple_tag_v3", "--agent=ppo", "--learner_mode=gorila"],
        "role adversary: learner_mode=gorila needs an agent whose update is one gradient",
    ),
]


@pytest.fixture(scope="module")
def bad_input_results(tmp_path_factory):
    """Every case's CLI run, started a few at a time: each process spends about
    10 s importing TensorFlow, JAX and envpool before it reads its flags, and
    run one after another the cases took 5 minutes of the suite."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        runs = {
            tuple(flags): pool.submit(_train, str(tmp_path_factory.mktemp("bad_input")), *flags)
            for flags, _ in BAD_INPUTS
        }
        results = {flags: run.result() for flags, run in runs.items()}
    left_running = {p.pid for p in psutil.Process().children(recursive=True)} - before
    return results, left_running


@pytest.mark.parametrize("flags, message", BAD_INPUTS)
def test_bad_input_fails_with_one_line_and_nonzero_exit(flags, message, bad_input_results):
    if "MiniGrid" in flags[0] and "MiniGrid-Empty-5x5-v0" not in envpool.list_all_envs():
        pytest.skip("envpool 0.8.4 (the DeepMind set) has no MiniGrid")
    results, left_running = bad_input_results
    result = results[tuple(flags)]
    assert result.returncode in (1, 2), result.stderr[-2000:]  # sys.exit, not a signal
    errors = _error_lines(result)
    assert len(errors) == 1, result.stderr[-2000:]
    assert message in errors[0]
    assert "Traceback" not in result.stderr
    assert not left_running, "a bad input left processes running"


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("total_env_steps", "-5", "not a positive integer"),
        ("precision", "fp8", "should be one of"),
        ("learner_mode", "hogwild", "should be one of"),
        ("compression", "twobit", "should be one of"),
        ("num_ps_shards", "0", "not a positive integer"),
        ("num_learner_hosts", "0", "not a positive integer"),
    ],
)
def test_a_flag_refuses_a_bad_value(flag, value, message):
    with pytest.raises(ValueError, match=message):
        train.flags.FLAGS[flag].parser.parse(value)


def _check(agent="dqn", env="CartPole-v1", preset="auto", config=None, **settings):
    """What `python -m launch.train` checks before it starts, from a preset and overrides."""
    mode = settings.get("learner_mode", "sync")
    base, preset_settings = presets.load(preset, agent, env, set(train._EXPERIMENT_FLAGS), mode)
    agent_config = dataclasses.replace(base, **(config or {}))
    exp = experiment.ExperimentConfig(**{**preset_settings, "env_id": env, **settings})
    train.check_configs(registry.AGENTS[agent].builder(agent_config), exp)


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"env": "Pong-v4"}, "did you mean Pong-v5"),
        ({"config": {"batch_size": 0}}, "config.batch_size must be positive"),
        ({"config": {"adam_b1": 1.0}}, r"config.adam_b1 must lie in \[0, 1\)"),
        ({"config": {"precision": "fp8"}}, "config.precision must be one of"),
        ({"config": {"torso": "nature"}}, "nature torso needs uint8 image stacks"),
        ({"preset": "/tmp/gorila-no-such-preset.yaml"}, "does not exist"),
        (
            {"num_learner_hosts": 2, "launcher": "ray", "learner_mode": "gorila"},
            "num_learner_hosts=2 is one sync learner .* does not take learner_mode=gorila",
        ),
        (
            {"agent": "sac", "env": "Pendulum-v1", "learner_mode": "gorila"},
            "learner_mode=gorila needs an agent",
        ),
        ({"agent": "ppo", "demos": "/tmp"}, "learns on-policy.*agents that can: dqn, sac, qrdqn"),
        ({"config": {"demo_fraction": 0.25}}, "needs --demos=DIR"),
        ({"config": {"hot_replay_size": 500}}, "min_replay_size=1000 exceeds .*hot_replay_size"),
        ({"config": {"hot_replay_size": 120_000}}, "leaves no cold tier"),
        ({"config": {"cold_replay_size": 10_000}}, "needs a tiered replay"),
        ({"replay_cold_dir": "/tmp/cold"}, "is for a tiered replay: set --config.hot_replay_size"),
        ({"replay_cold_gb": 2.0}, "replay_cold_gb=2.0 is for a tiered replay"),
        ({"learner_mode": "federated", "num_clients": 1}, "needs num_clients >= 2, got 1"),
        (
            {"learner_mode": "federated", "num_clients": 3, "num_actors": 2},
            r"num_actors \(2\) must be at least num_clients \(3\)",
        ),
        (
            {"learner_mode": "federated", "launcher": "launchpad"},
            "learner_mode=federated does not support launcher=launchpad yet",
        ),
        ({"dp_clip_norm": 1.0}, "need learner_mode=federated"),
        (
            {"learner_mode": "federated", "dp_target_epsilon": 0.5},
            "dp_target_epsilon needs differential privacy: set dp_clip_norm",
        ),
        ({"replay_cold_compression": "zlib"}, "replay_cold_compression=zlib is for a tiered"),
        # Values that no comparison catches: NaN fails `<= 0` as it fails `> 0`.
        ({"config": {"learning_rate": float("nan")}}, "config.learning_rate must be a finite"),
        ({"config": {"learning_rate": float("inf")}}, "config.learning_rate must be a finite"),
        ({"heartbeat_interval_s": float("nan")}, "heartbeat_interval_s must be a finite"),
        ({"agent": "ppo", "config": {"clip_epsilon": float("nan")}}, "config.clip_epsilon must be"),
        # Budgets in which the learner cannot make one update.
        (
            {"config": {"min_replay_size": 50_000}, "total_env_steps": 5_000},
            r"total_env_steps=5000 cannot make one update: .* 50,000 env steps "
            r"\(config.min_replay_size=50000",
        ),
        (
            {"agent": "ppo", "total_env_steps": 1_000},
            r"total_env_steps=1000 cannot make one update: .*config.trajectory_length",
        ),
        (
            {"learner_mode": "federated", "total_env_steps": 1_500},
            r"needs 2,000 env steps .* for each of 2 clients",
        ),
        (
            {"config": {"batch_size": 100_000_000}},
            "config.batch_size=100000000 exceeds config.max_replay_size=120000",
        ),
        # Tables this host cannot hold, summed over the shards that all run here.
        (
            {"config": {"max_replay_size": 10**11}, "replay_backend": "native"},
            r"the replay's tables need 4470.3 GiB \(priority_table: 100,000,000,000 items",
        ),
        (
            {
                "config": {"max_replay_size": 10**11},
                "replay_backend": "native",
                "num_replay_shards": 2,
                "num_actors": 2,
            },
            r"need 4470.3 GiB \(priority_table: 50,000,000,000 items .* priority_table: 50,",
        ),
        # Over what a backend's table can hold, wherever its nodes run.
        (
            {
                "config": {"max_replay_size": 2**41},
                "replay_backend": "native",
                "launcher": "ray",
                "ray_address": "127.0.0.1:1",
            },
            r"'priority_table' would hold 2,199,023,255,552 items per shard, and a table of "
            r"--replay=native holds 1,099,511,627,776 at most",
        ),
        pytest.param(
            {"config": {"max_replay_size": 10**11}, "replay_backend": "reverb"},
            r"would hold 100,000,000,000 items .* --replay=reverb holds 2,147,483,647 at most",
            marks=pytest.mark.skipif(
                not replay.installed(replay.REVERB), reason="Reverb is the DeepMind set's"
            ),
        ),
    ],
)
def test_a_bad_setting_is_refused_before_anything_starts(inputs, message):
    with pytest.raises(ValueError, match=message):
        _check(**inputs)


SETTINGS = dataclasses.fields(experiment.ExperimentConfig)


@pytest.mark.parametrize("field", SETTINGS, ids=[field.name for field in SETTINGS])
def test_each_setting_is_a_flag_with_its_declared_default_help_and_group(field):
    name = field.metadata["flag"] or field.name
    flag = train.flags.FLAGS[name]
    assert train._EXPERIMENT_FLAGS[field.name].name == name
    assert flag.default == field.default
    assert flag.help.endswith(field.metadata["help"])  # an enum's help starts with its choices
    group = f"experiment settings: {field.metadata['group']}"
    assert train.flags.FLAGS.find_module_defining_flag(name) == group
    # --helpfull lists the flag in its group's section.
    assert re.search(rf"--(\[no\])?{name}:", train.flags.FLAGS.module_help(group))


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("replay_port", "65536", "in the range"),  # config_checks.PORT_RANGE
        ("max_restarts", "-1", "not a non-negative integer"),  # NON_NEGATIVE
        ("heartbeat_timeout", "-1", "not a non-negative number"),
        ("balance_remedy", "lower", "should be one of"),  # the field's choices
    ],
)
def test_a_settings_check_and_choices_become_its_flags_bounds(flag, value, message):
    with pytest.raises(ValueError, match=message):
        train.flags.FLAGS[flag].parser.parse(value)


def test_the_settings_groups_are_the_subsystems():
    groups = {field.metadata["group"] for field in SETTINGS}
    subsystems = {"actors", "replay", "learner", "gorila", "federated", "faults", "checkpoints"}
    assert subsystems | {"multi-host", "elastic", "balance", "run", "tracking"} == groups


@pytest.mark.parametrize(
    "argv, close",
    [
        (["--config.batch_sise=64"], "batch_size"),
        (["--agent=ppo", "--config.clip_epsilom=0.1"], "clip_epsilon"),
    ],
)
def test_an_unknown_config_field_names_its_close_matches(argv, close, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train._define_config_flag(["train", *argv])
    assert exit_info.value.code == 2
    (message,) = capsys.readouterr().err.splitlines()
    assert message.startswith("error: ") and f"did you mean {close}" in message


def test_list_presets_prints_every_preset_of_every_agent_and_exits_0(tmp_path):
    result = _train(str(tmp_path), "--list_presets")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {tuple(line.split()[:2]) for line in result.stdout.splitlines()}
    for name, agent in registry.AGENTS.items():
        for preset in agent.preset_names:
            assert (name, preset) in rows
            family, change = agent.preset_info[preset]
            assert family in result.stdout and change in result.stdout
    assert "auto (the default) picks by what --env is" in result.stdout
    assert not os.listdir(tmp_path), "listing started a run"


@pytest.fixture(scope="module")
def env_groups():
    """`--list_envs`'s output as {header line: env ids listed under it}."""
    groups, header = {}, None
    for line in listings.env_lines():
        if line.startswith("    "):
            groups[header] += line.split()
        else:
            header = line
            groups[header] = []
    return groups


def _header_of(groups, env_id):
    (header,) = [header for header, ids in groups.items() if env_id in ids]
    return header


def test_list_envs_names_the_agents_that_can_act_in_each_env(env_groups):
    assert (
        _header_of(env_groups, "CartPole-v1")
        == "classic_control | discrete actions: dqn, ppo, qrdqn"
    )
    assert _header_of(env_groups, "Pendulum-v1") == "classic_control | continuous actions: ppo, sac"
    assert _header_of(env_groups, "Pong-v5") == "atari | discrete actions: dqn, ppo, qrdqn"
    assert "dqn" not in _header_of(env_groups, "HalfCheetah-v4")  # nor qrdqn
    # envpool 1.2.5 could not describe FingerSpin's spaces; 0.8.4 (the DeepMind set) and 1.2.7 can.
    assert _header_of(env_groups, "FingerSpin-v1") == "mujoco.dmc | continuous actions: ppo, sac"
    # dm_control's dict observations, flattened.
    assert _header_of(env_groups, "CheetahRun-v1") == "mujoco.dmc | continuous actions: ppo, sac"
    assert _header_of(env_groups, "mpe/simple_spread_v3") == "mpe2 | discrete actions: dqn, ppo"
    assert _header_of(env_groups, "mpe/simple_tag_v3") == (
        "mpe2 | discrete actions, a role group per role: adversary (3): dqn, ppo; "
        "agent (1): dqn, ppo, qrdqn"
    )
    listed = [env_id for ids in env_groups.values() for env_id in ids]
    if gymnax_envs.known_env_ids():  # the default set's; the DeepMind set has no gymnax
        assert _header_of(env_groups, "gymnax/Breakout-MinAtar") == (
            "gymnax | discrete actions: dqn, ppo, qrdqn"
        )
    known = [*envpool.list_all_envs(), *multiagent.known_env_ids(), *gymnax_envs.known_env_ids()]
    assert sorted(listed) == sorted(known)
    gymnasium_line = "gymnasium | any registered Gymnasium env"
    assert any(header.startswith(gymnasium_line) for header in env_groups)


def test_the_cold_tier_flags_reach_each_replay_shards_tiers(tmp_path):
    base = presets.load("auto", "dqn", "CartPole-v1", set(train._EXPERIMENT_FLAGS))[0]
    builder = registry.AGENTS["dqn"].builder(dataclasses.replace(base, hot_replay_size=10_000))
    exp = experiment.ExperimentConfig(
        env_id="CartPole-v1",
        logdir=str(tmp_path),
        num_replay_shards=2,
        replay_cold_gb=1.5,
        replay_cold_compression="zlib",
    )
    train.check_configs(builder, exp)
    shard = exp.replay_tiering(builder, envs.env_spec("CartPole-v1")).for_shard(1, 2)
    assert shard.cold_bytes == int(1.5 * 2**30) // 2, "each shard takes its part of the disk"
    assert shard.cold_compression == "zlib"
    assert shard.cold_dir == str(tmp_path / "replay_cold" / "shard1")


@pytest.mark.parametrize(
    "rounds, message",
    [
        (None, r"needs federated_rounds: .* the target allows \d+ rounds"),
        (1000, r"federated_rounds=1000: 1000 rounds .* over the target 0.5: the target allows"),
    ],
    ids=["no rounds", "over the target"],
)
def test_a_federated_run_over_its_privacy_target_is_refused_before_it_starts(rounds, message):
    pytest.importorskip("dp_accounting")  # not in the DeepMind set, which refuses federated
    settings = dict(dp_clip_norm=1.0, dp_noise_multiplier=1.0, dp_target_epsilon=0.5)
    if rounds:
        settings["federated_rounds"] = rounds
    with pytest.raises(ValueError, match=message):
        _check(learner_mode="federated", **settings)


def _no_file_over(size: int) -> Callable[[], None]:
    """A child process's limit: writes past `size` bytes of a file fail (EFBIG), as a full
    disk fails them; Python ignores SIGXFSZ, so the write raises OSError."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


@pytest.mark.slow
def test_a_run_whose_final_save_fails_exits_1_with_its_summary_saying_so(tmp_path):
    # Checkpoints only at the end: the replay's table file is the first file over 100 kB.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.train",
            "--launcher=local",
            "--replay=native",  # the same file on both sets (Reverb's differ)
            "--total_env_steps=3000",
            "--checkpoint_interval_steps=1000000",
            "--eval_episodes=2",
            f"--logdir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_no_file_over(100_000),
    )
    assert result.returncode == 1, result.stderr[-3000:]
    (error,) = _error_lines(result)
    assert error.startswith("error: the run failed as it stopped, its final checkpoint may be ")
    assert "File too large" in error and f"(summary in {tmp_path})" in error
    assert "Traceback" not in result.stderr  # it is in the log file
    assert "File too large" in (tmp_path / "third_party.log").read_text()
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    assert summary["problem"] == error.removeprefix("error: ").rpartition(" (summary")[0]
    assert summary["learner_steps"] > 0 and summary["final_eval_episodes"] == 2
    # No partial checkpoint carries a step's name.
    assert checkpoint.saved_steps(str(tmp_path)) == []
