"""The seams: the skeleton knows no agent, and every agent fills the whole builder contract."""

import ast
import inspect
import pathlib

import pytest

from agents import dqn
from gorila_jax import builder as builder_lib

REPO = pathlib.Path(__file__).resolve().parent.parent


def _imported_modules(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted((REPO / "gorila_jax").rglob("*.py")), ids=str)
def test_skeleton_never_imports_agents_or_launch(path):
    offending = {m for m in _imported_modules(path) if m.split(".")[0] in ("agents", "launch")}
    assert not offending, f"{path.relative_to(REPO)} imports {offending}"


def test_skeleton_never_names_an_agent():
    for path in (REPO / "gorila_jax").rglob("*.py"):
        code = path.read_text().lower()
        for agent in ("dqn", "ppo", "sac"):
            assert f'"{agent}"' not in code and f"'{agent}'" not in code, (
                f"{path.relative_to(REPO)} branches on the agent name {agent!r}"
            )


def test_dqn_builder_implements_the_whole_contract():
    contract = {
        name for name, _ in inspect.getmembers(builder_lib.AgentBuilder) if not name.startswith("_")
    } | set(builder_lib.AgentBuilder.__annotations__)
    builder = dqn.DQNBuilder(dqn.DQNConfig())
    missing = {name for name in contract if not hasattr(builder, name)}
    assert not missing
