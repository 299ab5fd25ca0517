"""QR-DQN plugs in through the builder alone: no module under gorila_jax/ names it."""

import pathlib
import re

SKELETON = pathlib.Path(__file__).resolve().parents[3] / "gorila_jax"
# A call such as `np.quantile(...)` (a statistic of returns) names numpy's function, not
# the agent; any other mention of quantiles would be QR-DQN's head leaking into the skeleton.
NAMES = re.compile(r"qr[-_ ]?dqn|(?<!\.)quantile", re.IGNORECASE)


def test_no_skeleton_module_names_qrdqn_or_quantiles():
    sources = sorted(SKELETON.rglob("*.py"))
    assert len(sources) > 20  # the skeleton itself was found, not an empty folder
    hits = [
        f"{path.relative_to(SKELETON.parent)}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if NAMES.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_the_pattern_finds_each_way_of_naming_the_agent():
    for text in ("QRDQNBuilder", "agents.qrdqn", "QR-DQN", "qr_dqn", "num_quantiles"):
        assert NAMES.search(text), text
    assert not NAMES.search("np.quantile(returns, 0.25)")
