"""The seams: the skeleton knows no agent, its folders import only downward, and no module
of the project imports itself through others. (Every registered agent's contract:
tests/agents/test_builder_interface.py.)"""

import ast
import pathlib

import pytest

from gorila_jax import replay

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


# The skeleton's layers, lowest first: a module may import its own layer or a lower one.
# Top-level modules are the contracts agents use; `builder` sits above replay because
# an agent's builder names its replay tables and item codec.
LAYERS = (
    (
        "compat",
        "xla_cpu",
        "types",
        "parallel",
        "precision",
        "envs",
        "env_api",
        "gym_envs",
        "gymnax_envs",
        "multiagent",
        "metrics",
        "curves",
        "plots",
        "config_checks",
        "console",
        "text",
        "tracking",
    ),
    ("replay",),
    ("builder",),
    ("distributed",),
    ("health",),
    ("learning",),
    ("gorila", "federated", "anakin"),
    # Demonstrations are recorded by acting and loaded through an actor's adder.
    ("acting", "demonstrations"),
    ("run",),
)
LAYER_OF = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}
SKELETON_FILES = sorted((REPO / "gorila_jax").rglob("*.py"))


def _part(module: str) -> str | None:
    """The layer name of a gorila_jax module ("gorila_jax.replay.codec" -> "replay")."""
    pieces = module.split(".")
    if pieces[0] != "gorila_jax" or len(pieces) < 2:
        return None
    return pieces[1]


def _own_part(path: pathlib.Path) -> str:
    relative = path.relative_to(REPO / "gorila_jax").with_suffix("")
    return relative.parts[0]


def test_every_skeleton_module_belongs_to_a_layer():
    unplaced = {
        _own_part(path) for path in SKELETON_FILES if _own_part(path) not in ("__init__",)
    } - set(LAYER_OF)
    assert not unplaced, f"add {unplaced} to LAYERS in tests/test_layering.py"


@pytest.mark.parametrize("path", SKELETON_FILES, ids=str)
def test_skeleton_imports_point_downward(path):
    if _own_part(path) == "__init__":
        return
    rank = LAYER_OF[_own_part(path)]
    upward = {
        module
        for module in _imported_modules(path)
        if _part(module) is not None and LAYER_OF.get(_part(module), -1) > rank
    }
    assert not upward, f"{path.relative_to(REPO)} (layer {_own_part(path)}) imports {upward}"


def test_replay_and_distribution_never_import_learning_gorila_or_run():
    for path in SKELETON_FILES:
        if _own_part(path) not in ("replay", "distributed"):
            continue
        offending = {
            m for m in _imported_modules(path) if _part(m) in ("learning", "gorila", "run")
        }
        assert not offending, f"{path.relative_to(REPO)} imports {offending}"


def test_code_outside_replay_uses_only_its_package_interface():
    """`gorila_jax.replay` is the interface; its modules are free to change behind it."""
    for root in ("gorila_jax", "agents", "launch", "bench", "tests"):
        for path in (REPO / root).rglob("*.py"):
            if path.is_relative_to(REPO / "gorila_jax" / "replay"):
                continue
            inner = {m for m in _imported_modules(path) if m.startswith("gorila_jax.replay.")}
            tree = ast.parse(path.read_text())
            inner |= {
                f"gorila_jax.replay.{alias.name}"
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "gorila_jax.replay"
                for alias in node.names
            }
            assert not inner, f"{path.relative_to(REPO)} imports {inner}: use gorila_jax.replay"


# The Reverb backend: the only modules that may import reverb or tensorflow.
REVERB_BACKEND = {f"gorila_jax/replay/{name}.py" for name in replay.REVERB_MODULES}


def _imports_reverb_or_tensorflow(path: pathlib.Path) -> bool:
    return any(m.split(".")[0] in ("reverb", "tensorflow") for m in _imported_modules(path))


def test_only_the_reverb_backend_imports_reverb_or_tensorflow():
    """Agents, the acting, learning, Gorila and run layers, and the native backend know the
    replay by its interface (`gorila_jax/replay/api.py`) alone."""
    offending = [
        str(path.relative_to(REPO))
        for root in ("gorila_jax", "agents", "launch")
        for path in sorted((REPO / root).rglob("*.py"))
        if _imports_reverb_or_tensorflow(path) and str(path.relative_to(REPO)) not in REVERB_BACKEND
    ]
    assert not offending


def test_the_native_backend_needs_no_reverb_module():
    """The native node, table, sampler and the interface import nothing of Reverb's backend,
    directly or through another replay module."""
    replay_dir = REPO / "gorila_jax" / "replay"
    native = ("api", "native_node", "native_table", "native_sampler", "manifest", "writers")
    seen, todo = set(), [f"gorila_jax.replay.{name}" for name in native]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = replay_dir / f"{module.rsplit('.', 1)[1]}.py"
        assert f"gorila_jax/replay/{path.name}" not in REVERB_BACKEND, f"{module} is Reverb's"
        assert not _imports_reverb_or_tensorflow(path), f"{module} imports reverb or tensorflow"
        for imported in _imported_modules(path):
            if imported == "gorila_jax.replay":
                continue
            if imported.startswith("gorila_jax.replay."):
                todo.append(imported)
        tree = ast.parse(path.read_text())
        todo += [
            f"gorila_jax.replay.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "gorila_jax.replay"
            for alias in node.names
        ]


def _imports_ray(path: pathlib.Path) -> bool:
    return any(m.split(".")[0] == "ray" for m in _imported_modules(path))


def test_only_the_ray_launcher_and_placement_import_ray():
    launchers = REPO / "gorila_jax" / "distributed" / "launchers"
    placement = REPO / "gorila_jax" / "distributed" / "placement.py"
    offending = [
        str(path.relative_to(REPO))
        for path in SKELETON_FILES
        if _imports_ray(path) and not (path.is_relative_to(launchers) or path == placement)
    ]
    assert not offending


def test_skeleton_never_names_an_agent():
    for path in (REPO / "gorila_jax").rglob("*.py"):
        code = path.read_text().lower()
        for agent in ("dqn", "ppo", "sac"):
            assert f'"{agent}"' not in code and f"'{agent}'" not in code, (
                f"{path.relative_to(REPO)} branches on the agent name {agent!r}"
            )


# ---------------------------------------------------------------- import cycles

PROJECT_ROOTS = ("gorila_jax", "agents", "launch")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, at the top or inside a function alike
    (an import moved into a function hides a cycle from Python, not from this graph)."""
    paths = {
        _module_name(path): path for root in PROJECT_ROOTS for path in (REPO / root).rglob("*.py")
    }
    graph: dict[str, set[str]] = {module: set() for module in paths}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # `from package import module` needs that module; `from module import
                # name`, the module (a package's name: its __init__).
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                while target and target not in paths:  # a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_anywhere_in_the_project():
    cycles = _cycles(_project_import_graph())
    assert not cycles, f"import cycles: {cycles}"


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
