"""Runs a module with some packages made unimportable, as on a host that lacks them.

  python bench/without.py envpool,ray,reverb,tensorflow -m bench.gpu_learner --check_devices

`bench/gpu_check.sh --offline` runs its learner stage so: the learner path must need
nothing beyond JAX's stack (a GPU node's site packages) at import time or while it runs.
"""

import importlib.abc
import os
import runpy
import sys


class _Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (bench/without.py)", name=fullname
            )
        return None


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        sys.exit(f"usage: {sys.argv[0]} PACKAGE[,PACKAGE...] -m MODULE [ARGS...]")
    names = set(sys.argv[1].split(","))
    loaded = sorted(name for name in names if name in sys.modules)
    if loaded:
        sys.exit(f"error: {', '.join(loaded)} already imported before bench/without.py ran")
    sys.meta_path.insert(0, _Refuse(names))
    sys.path[0] = os.getcwd()  # as `python -m MODULE` has it, not this script's folder
    module = sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
