"""docs/flags.md's table is the flags' own help, and says so only while it is fresh."""

import dataclasses

from absl import flags

from gorila_jax.run import combinations, experiment
from launch import flag_docs, train


def test_the_flags_table_in_the_docs_is_fresh():
    assert flag_docs.current() == flag_docs.render(), "run: python -m launch.flag_docs"


def test_the_combinations_table_in_the_docs_is_fresh_and_names_every_refusal():
    table = flag_docs.render_combinations()
    assert flag_docs.current_combinations() == table, "run: python -m launch.flag_docs"
    for kind in combinations.KINDS:
        (row,) = [
            line
            for line in table.splitlines()
            if line.startswith("|") and line.split("|")[1].strip().strip("`") == kind.name
        ]
        assert all(feature in row for feature in kind.refuses), row


def test_the_table_is_the_same_after_a_command_line_defined_the_config_flag():
    # CI: a test of launch.train in the same process had defined --config first.
    before = flag_docs.render()
    _forget_the_config_flag()  # another launch.train test in this process may have made it
    train._define_config_flag(["train", "--agent=dqn"])
    try:
        assert "config" in flags.FLAGS  # the flag the table leaves out is there now
        assert flag_docs.render() == before
    finally:
        _forget_the_config_flag()


def _forget_the_config_flag() -> None:
    """As launch/sweep.py does between two runs' flags."""
    for name in [name for name in flags.FLAGS if name == "config" or name.startswith("config.")]:
        delattr(flags.FLAGS, name)


def test_the_table_has_every_setting_once_with_its_help():
    table = flag_docs.render()
    for field in dataclasses.fields(experiment.ExperimentConfig):
        name = field.metadata["flag"] or field.name
        rows = [line for line in table.splitlines() if line.startswith(f"| `--{name}` |")]
        assert len(rows) == 1, f"--{name}: {len(rows)} rows"
        first_words = " ".join(field.metadata["help"].split()[:3]).replace("<", "&lt;")
        assert first_words in rows[0], (name, rows[0])
    for own in ("agent", "preset", "precision", "list_envs"):
        assert f"| `--{own}` |" in table


def test_check_fails_on_a_stale_table_and_the_rewrite_mends_it(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "flags.md"
    stale = flag_docs.render().replace("Actor nodes.", "Actors, as they were once described.")
    combos = flag_docs.render_combinations()
    doc.write_text(f"# Flags\n\n{stale}\n\n{combos}\n\nProse after the table stays.\n")
    monkeypatch.setattr(flag_docs, "DOC", doc)
    assert flag_docs.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert flag_docs.main([]) == 0
    assert flag_docs.main(["--check"]) == 0
    text = doc.read_text()
    assert text.startswith("# Flags\n") and text.endswith("Prose after the table stays.\n")
    assert "Actor nodes." in text
