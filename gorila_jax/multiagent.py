"""Multi-agent environments (PettingZoo's MPE, the `mpe2` package) as vector envs
that actors use like envpool's.

A task's agents fall into *roles* by name (`adversary_0`, `adversary_1` are the
role `adversary`); the agents of one role observe and act alike and share one
policy. `MultiAgentVectorEnv` steps `num_envs` copies of a task and hands each
role one batch of rows, one row per agent per copy (copy-major: copy 0's
agents first). `RoleEnv` is the envpool-shaped view of a task with one role:
`reset`, `step`, `send`/`recv`, spaces, and envpool's auto-reset rule (the step
after a copy's episode ended returns its first observation, with reward 0, and
ignores the actions), so that the actor, the evaluator and every agent's adder
take it unchanged.

Env ids are mpe2's own registry names: `mpe/simple_spread_v3`.
"""

import functools
import importlib
import re
from typing import Any

import gymnasium
import numpy as np

from gorila_jax import env_api, types

PREFIX = "mpe/"
# The task's `max_cycles`, mpe2's default: every episode ends (truncated) after it.
MAX_CYCLES = 25
_ROLE_OF_AGENT = re.compile(r"^(.*)_\d+$")


def is_multiagent(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


@functools.cache
def known_env_ids() -> tuple[str, ...]:
    """The MPE tasks mpe2 ships, by its registry names."""
    from mpe2 import all_modules  # noqa: PLC0415  only runs that ask for MPE import it

    return tuple(sorted(all_modules.mpe_environments))


def check_env_id(env_id: str) -> None:
    """Raises ValueError naming close matches if mpe2 has no task `env_id`."""
    env_api.check_known(env_id, known_env_ids(), "python -m launch.train --list_envs lists them")


def role_of(agent: str) -> str:
    """The role an agent's name gives it: `adversary_2` -> `adversary`."""
    match = _ROLE_OF_AGENT.match(agent)
    return match.group(1) if match else agent


def make_task(env_id: str, **task_kwargs: Any) -> Any:
    """One copy of the task: mpe2's parallel env, discrete actions, `MAX_CYCLES` steps."""
    if env_id not in known_env_ids():
        raise ValueError(f"unknown MPE task {env_id!r}; mpe2 has {', '.join(known_env_ids())}")
    module = importlib.import_module(f"mpe2.{env_id[len(PREFIX) :]}")
    return module.parallel_env(max_cycles=MAX_CYCLES, continuous_actions=False, **task_kwargs)


@functools.cache
def _roles(env_id: str) -> dict[str, tuple[tuple[str, ...], types.EnvSpec]]:
    """role -> (its agents in the task's order, the spec of one of its rows)."""
    task = make_task(env_id)
    agents_by_role: dict[str, list[str]] = {}
    for agent in task.possible_agents:
        agents_by_role.setdefault(role_of(agent), []).append(agent)
    roles = {}
    for role, agents in agents_by_role.items():
        obs_space, act_space = task.observation_space(agents[0]), task.action_space(agents[0])
        if any(
            task.observation_space(a) != obs_space or task.action_space(a) != act_space
            for a in agents
        ):
            raise ValueError(
                f"{env_id}: the agents of role {role!r} ({', '.join(agents)}) differ in their "
                "spaces; one role's agents share one policy"
            )
        spec = types.EnvSpec(
            env_id=env_id,
            observation_shape=tuple(obs_space.shape),
            observation_dtype="float32",
            action_shape=(),
            action_dtype="int32",
            num_actions=int(act_space.n),
            max_episode_steps=MAX_CYCLES,
            agents_per_env=len(agents),
        )
        roles[role] = (tuple(agents), spec)
    task.close()
    return roles


def role_specs(env_id: str) -> dict[str, types.EnvSpec]:
    """role -> the spec its agents' rows have (`agents_per_env` rows per copy)."""
    return {role: spec for role, (_, spec) in _roles(env_id).items()}


def roles_of(env_id: str) -> tuple[str, ...]:
    """The roles of a task with several roles, sorted; () for any other env (a run of
    role groups, gorila_jax/run/role_program.py, is one on such a task)."""
    if not is_multiagent(env_id):
        return ()
    roles = tuple(sorted(role_specs(env_id)))
    return roles if len(roles) > 1 else ()


def env_spec(env_id: str) -> types.EnvSpec:
    """The spec of a task with one role.

    Raises:
      ValueError: for an unknown task, or one with several roles (saying which).
    """
    specs = role_specs(env_id)
    if len(specs) > 1:
        described = ", ".join(f"{role} ({spec.agents_per_env})" for role, spec in specs.items())
        raise ValueError(
            f"{env_id} has {len(specs)} roles: {described}; a run acts for one role only, so "
            "it takes tasks whose agents all share one role (mpe/simple_spread_v3, "
            "mpe/simple_reference_v3, mpe/simple_v3, ...)"
        )
    return next(iter(specs.values()))


class MultiAgentVectorEnv:
    """`num_envs` copies of an MPE task, stepped together, each role a batch of rows."""

    def __init__(self, env_id: str, num_envs: int, seed: int, **task_kwargs: Any):
        if num_envs < 1:
            raise ValueError(f"num_envs must be positive, got {num_envs}")
        self.env_id, self.num_envs = env_id, num_envs
        self.agents = {role: agents for role, (agents, _) in _roles(env_id).items()}
        self._rows_per_copy = {role: len(agents) for role, agents in self.agents.items()}
        self._copies = [make_task(env_id, **task_kwargs) for _ in range(num_envs)]
        self._seed, self._seeded = seed, False
        # A copy whose episode ended on the last step restarts on the next one.
        self._ended = np.zeros(num_envs, bool)

    def _rows(self, per_agent: list[dict[str, Any]], role: str, dtype: Any) -> np.ndarray:
        return np.asarray(
            [values[agent] for values in per_agent for agent in self.agents[role]], dtype
        )

    def _observations(self, per_copy: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return {role: self._rows(per_copy, role, np.float32) for role in self.agents}

    def reset(self) -> dict[str, np.ndarray]:
        """Every copy's first observations, by role. Copy i is seeded with seed + i at the
        first reset; later resets go on from each copy's own random state, as envpool's
        do (an evaluator that resets for every evaluation plays new episodes each time)."""
        seeds = (
            [None] * self.num_envs
            if self._seeded
            else range(self._seed, self._seed + self.num_envs)
        )
        self._seeded = True
        per_copy = [copy.reset(seed=seed)[0] for seed, copy in zip(seeds, self._copies)]
        self._ended[:] = False
        return self._observations(per_copy)

    def step(self, actions: dict[str, np.ndarray]) -> dict[str, tuple]:
        """role -> (observations, rewards, terminated, truncated) after acting `actions`
        (role -> one action per row). Copies that ended on the last step restart instead,
        as envpool's do, ignoring their rows' actions."""
        obs, rewards, terminated, truncated = [], [], [], []
        for i, copy in enumerate(self._copies):
            if self._ended[i]:
                first, _ = copy.reset()
                zeros = dict.fromkeys(first, 0.0)
                obs.append(first), rewards.append(zeros)
                terminated.append(dict.fromkeys(first, False))
                truncated.append(dict.fromkeys(first, False))
                self._ended[i] = False
                continue
            act = {
                agent: int(actions[role][i * self._rows_per_copy[role] + k])
                for role, agents in self.agents.items()
                for k, agent in enumerate(agents)
            }
            o, r, te, tr, _ = copy.step(act)
            obs.append(o), rewards.append(r), terminated.append(te), truncated.append(tr)
            # Agents leave `copy.agents` as they finish; MPE's all end together.
            self._ended[i] = not copy.agents
        return {
            role: (
                self._rows(obs, role, np.float32),
                self._rows(rewards, role, np.float32),
                self._rows(terminated, role, bool),
                self._rows(truncated, role, bool),
            )
            for role in self.agents
        }

    def close(self) -> None:
        for copy in self._copies:
            copy.close()


class RoleEnv:
    """The envpool-shaped view of a task with one role: arrays in, arrays out."""

    def __init__(self, env_id: str, num_envs: int, seed: int, **task_kwargs: Any):
        self.spec_ = env_spec(env_id)  # refuses tasks of several roles
        self._env = MultiAgentVectorEnv(env_id, num_envs, seed, **task_kwargs)
        (self.role,) = self._env.agents
        self.num_rows = num_envs * self.spec_.agents_per_env
        self._sent: np.ndarray | None = None
        self._info = {"env_id": np.repeat(np.arange(num_envs), self.spec_.agents_per_env)}

    @property
    def observation_space(self) -> Any:
        return gymnasium.spaces.Box(-np.inf, np.inf, self.spec_.observation_shape, np.float32)

    @property
    def action_space(self) -> Any:
        return gymnasium.spaces.Discrete(self.spec_.num_actions)

    def reset(self) -> tuple[np.ndarray, dict]:
        return self._env.reset()[self.role], dict(self._info)

    def step(self, action: np.ndarray) -> tuple:
        action = np.asarray(action)
        if action.shape != (self.num_rows,):
            raise ValueError(
                f"{self.spec_.env_id}: expected {self.num_rows} actions (one per agent row), "
                f"got shape {action.shape}"
            )
        obs, reward, terminated, truncated = self._env.step({self.role: action})[self.role]
        return obs, reward, terminated, truncated, dict(self._info)

    def send(self, action: np.ndarray) -> None:
        self._sent = action

    def recv(self) -> tuple:
        action, self._sent = self._sent, None
        if action is None:
            raise RuntimeError("recv() without send()")
        return self.step(action)

    def close(self) -> None:
        self._env.close()
