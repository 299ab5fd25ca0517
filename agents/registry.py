"""The agents `--agent` names: `AGENTS`, the one registry of agents.

Each entry holds an agent's builder, its config and its named presets (each agent's
presets.py). The CLI (launch/train.py, launch/evaluate.py), preset loading
(launch/presets.py) and the tests read it; an agent added here is checked by
tests/agents/test_builder_interface.py.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from agents import dqn, ppo, qrdqn, sac
from agents.dqn import presets as dqn_presets
from agents.ppo import presets as ppo_presets
from agents.qrdqn import presets as qrdqn_presets
from agents.sac import presets as sac_presets
from gorila_jax import builder as builder_lib

Preset = Callable[[str], tuple[Any, dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Agent:
    """One agent `--agent` can name.

    Attributes:
      builder: its `AgentBuilder` class, made from a config.
      config: its config dataclass; `config()` is its default.
      preset: preset name (not auto) -> (config, experiment settings).
      preset_names: the names `preset` takes.
      gorila_preset: `preset` as Gorila mode needs it; None: `preset` there too.
      preset_info: preset name -> (env family, what it changes), for `--list_presets`.
    """

    builder: type
    config: type
    preset: Preset
    preset_names: tuple[str, ...]
    gorila_preset: Preset | None = None
    preset_info: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


AGENTS = {
    "dqn": Agent(
        dqn.DQNBuilder,
        dqn.DQNConfig,
        dqn_presets.dqn_preset,
        dqn_presets.DQN_PRESETS,
        dqn_presets.dqn_gorila_preset,
        dqn_presets.DQN_PRESET_INFO,
    ),
    "ppo": Agent(
        ppo.PPOBuilder,
        ppo.PPOConfig,
        ppo_presets.ppo_preset,
        ppo_presets.PPO_PRESETS,
        preset_info=ppo_presets.PPO_PRESET_INFO,
    ),
    "sac": Agent(
        sac.SACBuilder,
        sac.SACConfig,
        sac_presets.sac_preset,
        sac_presets.SAC_PRESETS,
        preset_info=sac_presets.SAC_PRESET_INFO,
    ),
    "qrdqn": Agent(
        qrdqn.QRDQNBuilder,
        qrdqn.QRDQNConfig,
        qrdqn_presets.qrdqn_preset,
        qrdqn_presets.QRDQN_PRESETS,
        qrdqn_presets.qrdqn_gorila_preset,
        qrdqn_presets.QRDQN_PRESET_INFO,
    ),
}


def agents_taking_demos() -> tuple[str, ...]:
    """The agents that can learn from demonstrations (`--demos`): their builder is
    `builder.LearnsFromDemonstrations`."""
    return tuple(
        name
        for name, agent in AGENTS.items()
        if isinstance(agent.builder(agent.config()), builder_lib.LearnsFromDemonstrations)
    )
