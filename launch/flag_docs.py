"""docs/flags.md's generated tables.

The table of flags, made from launch.train's flags: its own, and one per
`ExperimentConfig` field in that field's group, each with the help it was declared with
(`config_checks.setting`), as `--helpfull` shows them. And the table of settings that
do not combine, made from `gorila_jax/run/combinations.py`, the table the checks use.

    python -m launch.flag_docs          # rewrites both tables in docs/flags.md
    python -m launch.flag_docs --check  # exit 1 if one is stale

tests/launch/test_flag_docs.py fails when one is stale. To change a row, change the
flag's help (or the setting's, or the combinations table) and run this.
"""

import dataclasses
import pathlib
import sys

from absl import flags

from gorila_jax.run import combinations, experiment
from gorila_jax.run.experiment_config import SETTING_GROUPS
from launch import train

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "flags.md"
BEGIN = "<!-- the flags table: `python -m launch.flag_docs` writes it; edit the flags' help -->"
END = "<!-- end of the flags table -->"
COMBINATIONS_BEGIN = (
    "<!-- settings that do not combine: `python -m launch.flag_docs` writes it from "
    "gorila_jax/run/combinations.py -->"
)
COMBINATIONS_END = "<!-- end of the combinations table -->"


def _default(flag: flags.Flag) -> str:
    value = flag.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "empty"
    return f"`{value}`"


def _row(flag: flags.Flag) -> str:
    # An enum flag's help starts with its choices, as absl writes it: <a|b>: ... Markdown
    # would take <...> for a tag and | for a column.
    meaning = " ".join(flag.help.split()).replace("|", "\\|").replace("<", "&lt;")
    return f"| `--{flag.name}` | {_default(flag)} | {meaning} |"


def _groups() -> list[str]:
    """The settings' groups, in their declared order (`SETTING_GROUPS`).

    Raises:
      ValueError: a field whose group is not declared there.
    """
    fields = dataclasses.fields(experiment.ExperimentConfig)
    undeclared = {field.metadata["group"] for field in fields} - set(SETTING_GROUPS)
    if undeclared:
        raise ValueError(f"settings groups {sorted(undeclared)} are not in SETTING_GROUPS")
    return list(SETTING_GROUPS)


def render() -> str:
    """The table, between its markers."""
    registry = flags.FLAGS
    # `--config` (and ml_collections' `--config.<field>`) is defined only when a command
    # line is parsed, for its --agent's config: said in the prose, not in the table.
    own = [
        flag
        for flag in registry.get_flags_for_module(train.__name__)
        if flag.name != "config" and not flag.name.startswith("config.")
    ]
    sections = [("what to run", own)]
    sections += [
        (f"settings: {group}", registry.get_flags_for_module(f"experiment settings: {group}"))
        for group in _groups()
    ]
    lines = [BEGIN, "", "| flag | default | meaning |", "|---|---|---|"]
    for title, section in sections:
        lines.append(f"| **{title}** | | |")
        lines += [_row(flag) for flag in section]
    return "\n".join([*lines, "", END])


def render_combinations() -> str:
    """The table of settings that do not combine, between its markers."""
    return "\n".join([COMBINATIONS_BEGIN, "", combinations.markdown_table(), "", COMBINATIONS_END])


def _block(text: str, begin: str, end: str) -> str:
    if begin not in text or end not in text:
        raise ValueError(f"{DOC} has no table markers ({begin!r} ... {end!r})")
    return text[text.index(begin) : text.index(end) + len(end)]


def current() -> str:
    """The flags table as docs/flags.md has it now."""
    return _block(DOC.read_text(), BEGIN, END)


def current_combinations() -> str:
    """The combinations table as docs/flags.md has it now."""
    return _block(DOC.read_text(), COMBINATIONS_BEGIN, COMBINATIONS_END)


def main(argv: list[str]) -> int:
    fresh = {current(): render(), current_combinations(): render_combinations()}
    if "--check" in argv:
        stale = any(now != new for now, new in fresh.items())
        if stale:
            print(f"{DOC} is stale: run python -m launch.flag_docs", file=sys.stderr)
        return int(stale)
    text = DOC.read_text()
    for now, new in fresh.items():
        text = text.replace(now, new)
    DOC.write_text(text)
    print(f"wrote the tables of {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
