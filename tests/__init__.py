"""The test suite. `REPO`: the repository's root, where child processes run."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
