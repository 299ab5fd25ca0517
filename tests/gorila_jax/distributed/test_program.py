"""The program graph: groups, handles, names; independent of any launcher."""

import pytest

from gorila_jax.distributed import program
from tests import fakes


def test_groups_and_handles():
    graph = fakes.make_counting_program(num_producers=3)
    assert list(graph.groups) == ["counter", "producer"]
    assert [spec.name for spec in graph.groups["producer"]] == [
        "producer/0",
        "producer/1",
        "producer/2",
    ]
    assert graph.node("producer/1").dependencies() == {"counter/0"}
    assert graph.resources("producer").num_cpus == 0.5
    assert graph.resolve_name("counter") == "counter/0"  # a one-node group by its name


def test_map_handles_rebuilds_nested_arguments():
    handle = program.Handle("replay/0")
    tree = {"a": [handle, 1], "b": (handle,)}
    resolved = program.map_handles(lambda h: f"client of {h.name}", tree)
    assert resolved == {"a": ["client of replay/0", 1], "b": ("client of replay/0",)}


def test_add_node_outside_a_group_is_rejected():
    graph = program.Program()
    with pytest.raises(ValueError, match="inside `with program.group"):
        graph.add_node(fakes.Counter)


def test_ambiguous_or_unknown_names_are_rejected():
    graph = fakes.make_counting_program(num_producers=2)
    with pytest.raises(KeyError, match="no single node called 'producer'"):
        graph.resolve_name("producer")
    with pytest.raises(KeyError, match="learner"):
        graph.node("learner")


def test_negative_resources_are_rejected():
    with pytest.raises(ValueError, match="non-negative"):
        program.Resources(num_cpus=-1)
