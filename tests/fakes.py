"""Small nodes for testing the program graph and launchers (never used by the library)."""

import os
import threading
import time

from gorila_jax.distributed import program


class Counter:
    """Counts what producers add; a node without a run loop."""

    def __init__(self):
        self._lock = threading.Lock()
        self._total = 0
        self._by_source: dict[str, int] = {}

    def add(self, source: str, amount: int) -> int:
        with self._lock:
            self._total += amount
            self._by_source[source] = self._by_source.get(source, 0) + amount
            return self._total

    def total(self) -> int:
        return self._total

    def sources(self) -> dict[str, int]:
        with self._lock:
            return dict(self._by_source)

    def pid(self) -> int:
        return os.getpid()


class Producer(program.Worker):
    """Adds 1 to the counter `limit` times (forever if 0), then returns from run."""

    def __init__(self, name: str, counter: program.Client, limit: int = 0):
        super().__init__()
        self._name, self._counter, self._limit = name, counter, limit
        self.produced = 0

    def run(self) -> None:
        while not self.stopping and (self._limit == 0 or self.produced < self._limit):
            self._counter.add(self._name, 1)
            self.produced += 1
            time.sleep(0.001)

    def pid(self) -> int:
        return os.getpid()


class Failing(program.Worker):
    """A node whose run raises, to test failure reporting."""

    def run(self) -> None:
        raise ValueError("boom from the failing node")


class FailingToConstruct(program.Worker):
    """A node whose constructor raises, as a replay node restoring a damaged file does."""

    def __init__(self):
        raise RuntimeError("corrupted record at 0")

    def run(self) -> None:
        pass


def wait_until(predicate, timeout_s: float) -> bool:
    """Polls `predicate` until true or `timeout_s` passed: a liveness bound, not a speed claim."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def threads_named(*prefixes: str) -> list[str]:
    """Names of this process's live threads that start with one of `prefixes`."""
    return [t.name for t in threading.enumerate() if t.name.startswith(prefixes)]


def make_counting_program(num_producers: int, limit: int = 0) -> program.Program:
    graph = program.Program("counting")
    with graph.group("counter", program.Resources(num_cpus=0)):
        counter = graph.add_node(Counter)
    with graph.group("producer", program.Resources(num_cpus=0.5)):
        for index in range(num_producers):
            graph.add_node(Producer, f"producer/{index}", counter, limit)
    return graph
