"""Text for people: errors in one line, without terminal escape codes."""

import re

# Colour and cursor codes (ESC [ ... letter), which Ray puts in its errors' text.
_ESCAPE_CODE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def plain(text: str) -> str:
    """`text` without terminal escape codes: for files, pipes and one-line reports."""
    return _ESCAPE_CODE.sub("", text)


def first_line(error: BaseException) -> str:
    """`Type: first non-blank line` of `error`, without escape codes: one-line reports."""
    lines = [line for line in plain(str(error)).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:500]
