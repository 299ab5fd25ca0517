"""What `launch.train --list_presets` and `--list_envs` print: every agent's presets, what
`--preset=auto` picks, and the env ids by family with the agents that can act in each."""

import textwrap

import envpool
import envpool.registration

from agents import registry
from gorila_jax import envs, gymnax_envs, multiagent, types
from launch import families, presets


def preset_lines() -> list[str]:
    """One line per preset of every agent: agent, preset, env family, what it changes."""
    rows = [("agent", "preset", "env family", "what it changes")]
    for agent_name, agent in registry.AGENTS.items():
        for preset in agent.preset_names:
            family, change = agent.preset_info.get(preset, ("?", "(not described)"))
            auto = [f for f, pick in presets.AUTO_PRESETS.items() if pick.get(agent_name) == preset]
            family += f" [auto: {', '.join(auto)}]" if auto else ""
            rows.append((agent_name, preset, family, change))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3]
        for row in rows
    ]
    return [*lines, *auto_lines()]


def auto_lines() -> list[str]:
    """What `--preset=auto` picks: one line per env family (by the env's spec)."""
    lines = ["auto (the default) picks by what --env is (its observations and actions):"]
    for family, picks in presets.AUTO_PRESETS.items():
        chosen = ", ".join(f"{agent} {name}" for agent, name in sorted(picks.items()))
        lines.append(f"  {family}: {families.FAMILIES[family]} -> {chosen}")
    for family, by_name in presets.BY_ENV_NAME.items():
        for env_name, preset in by_name.items():
            agents = [
                a
                for a in sorted(presets.AUTO_PRESETS[family])
                if preset in registry.AGENTS[a].preset_names
            ]
            lines.append(f"  {env_name} ({family}), for {', '.join(agents)}: {preset}")
    return lines


def _agents_that_act(spec: types.EnvSpec, cache: dict) -> tuple[str, ...]:
    """The agents a run accepts on `spec` with `--preset=auto`: its family's agents
    (`presets.AUTO_PRESETS`) whose builder takes its observations and actions.

    Whether a builder accepts an env depends on its preset and the shapes and
    kinds of observations and actions, so envs alike in these share one check.
    """
    family = families.family(spec)
    key = (family, spec.observation_shape, spec.observation_dtype, spec.action_shape)
    if key not in cache:
        accepted = []
        for name in presets.agents_for(family):
            config, _ = registry.AGENTS[name].preset(presets.auto_preset(name, spec))
            try:
                registry.AGENTS[name].builder(config).validate(1, spec)
            except ValueError:  # the builder rejects it
                continue
            accepted.append(name)
        cache[key] = tuple(accepted)
    return cache[key]


def _roles_header(env_id: str, cache: dict) -> str:
    """The `--list_envs` header of a task of several roles: its roles, and the agents
    that can act for each (a role group each; --role_agents picks)."""
    roles = [
        f"{role} ({spec.agents_per_env}): {', '.join(_agents_that_act(spec, cache)) or 'no agent'}"
        for role, spec in multiagent.role_specs(env_id).items()
    ]
    return f"discrete actions, a role group per role: {'; '.join(roles)}"


def env_lines() -> list[str]:
    """envpool's, mpe2's and gymnax's task ids by family and action kind, each group under a
    line naming the agents that can act there."""
    groups: dict[tuple[str, str], list[str]] = {}
    cache: dict = {}
    tasks = [
        *(
            (env_id, envpool.registration.registry.specs[env_id][0])
            for env_id in envpool.list_all_envs()
        ),
        *((env_id, "mpe2") for env_id in multiagent.known_env_ids()),
        *((env_id, "gymnax") for env_id in gymnax_envs.known_env_ids()),
    ]
    for env_id, package in tasks:
        family = package.removeprefix("envpool.")
        if multiagent.roles_of(env_id):
            groups.setdefault((family, _roles_header(env_id, cache)), []).append(env_id)
            continue
        try:
            spec = envs.env_spec(env_id)
            families.family(spec)
        except ValueError as error:
            # Dict observations, channel-last images, Procgen without Qt, a spec
            # envpool cannot describe (launch/families.py). Without the env's own
            # name, envs that fail alike share one group.
            reason = str(error).splitlines()[0].replace(f"{env_id}: ", "").replace(env_id, "it")
            header = f"no agent: {reason}"
        else:
            agents = ", ".join(_agents_that_act(spec, cache)) or "no agent"
            kind = "discrete" if spec.discrete else "continuous"
            header = f"{kind} actions: {agents}"
        groups.setdefault((family, header), []).append(env_id)
    lines = []
    for (family, header), ids in sorted(groups.items()):
        lines.append(f"{family} | {header}")
        indent = {"initial_indent": "    ", "subsequent_indent": "    "}
        # Env ids have hyphens (CartPole-v1), which textwrap breaks at by default.
        wrapped = textwrap.wrap(" ".join(ids), 96, break_on_hyphens=False, **indent)
        lines.extend(wrapped)
    # Gymnasium's registry is open (a user's module adds to it): said, not listed.
    lines.append(
        "gymnasium | any registered Gymnasium env as gym:<id> (gym:CartPole-v1), or "
        "gym:<module>:<id> to import the module that registers it (docs/environments.md)"
    )
    return lines
