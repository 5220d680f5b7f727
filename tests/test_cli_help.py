"""`lorapilot --help` as a user reads it: every verb listed by its docstring's first paragraph
as prose re-wrapped to the terminal, not cut at the docstring's own line breaks."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

from lorapilot.cli import app


def test_the_verb_list_wraps_each_summary_to_the_terminal():
    proc = subprocess.run(
        [sys.executable, "-m", "lorapilot", "--help"],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"}, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = {ln.strip("│ ").split(" ", 1)[0]: ln for ln in proc.stdout.splitlines() if "│" in ln}
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.removesuffix("_cmd")
        first = inspect.getdoc(info.callback).split("\n\n")[0]
        # 400 columns hold every summary on one line: the whole paragraph is on the verb's
        assert " ".join(first.split()) in " ".join(lines[name].split()), name
