"""The README and docs/ stay true to the CLI: every `lorapilot ...` command they show names a
verb that exists and only flags that verb takes, every relative link points at a file, and the
README stays a front door (at most ~200 lines)."""

from __future__ import annotations

import re
import shlex

import typer
from conftest import ROOT

from lorapilot.cli import app

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
INLINE = re.compile(r"`((?:\.venv/bin/)?lorapilot [^`]+)`")


def commands(text: str) -> list[str]:
    """`lorapilot ...` command lines in code blocks (continuations joined) and inline code."""
    found, fence = [], None
    for line in text.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("```"):
            fence = None if fence is not None else line.strip("` ")
            continue
        if fence not in ("bash", "sh", "console", ""):
            continue
        line = line.split(" #", 1)[0].strip()
        m = re.search(r"(?:^|\s|-m )((?:\.venv/bin/)?lorapilot\s.*)$", line)
        if m and not line.startswith("#"):
            found.append(m.group(1))
    found += INLINE.findall(text)
    return found


def check(cmd: str, root) -> str | None:
    """None when the CLI takes the command's verb and flags, else what is wrong."""
    words = shlex.split(cmd.replace("[", " ").replace("]", " ").replace("|", " "))[1:]
    group = root
    path = []
    while hasattr(group, "commands") and words and not words[0].startswith("-"):
        sub = group.commands.get(words[0])
        if sub is None:
            break
        path.append(words.pop(0))
        group = sub
    if group is root:
        return f"no such verb in {cmd!r}"
    opts = {o for p in group.params for o in (*p.opts, *p.secondary_opts)}
    flags = [w.split("=", 1)[0] for w in words if w.startswith("--")]
    bad = [f for f in flags if f not in opts]
    return f"{' '.join(path)} takes no {', '.join(bad)} ({cmd!r})" if bad else None


def test_the_checker_finds_a_wrong_verb_and_a_wrong_flag():
    root = typer.main.get_command(app)
    assert check("lorapilot run PILOT --only r8", root) is None
    assert "no such verb" in check("lorapilot launch PILOT", root)
    assert "--fast" in check("lorapilot run PILOT --fast", root)
    assert check("lorapilot model fetch --image", root) is None
    assert commands("```bash\n.venv/bin/lorapilot check mypilot   # note\n```") == [
        ".venv/bin/lorapilot check mypilot"
    ]


def test_every_command_in_the_docs_is_one_the_cli_takes():
    root = typer.main.get_command(app)
    problems, seen = [], 0
    for page in PAGES:
        for cmd in commands(page.read_text(encoding="utf-8")):
            seen += 1
            if (why := check(cmd, root)) is not None:
                problems.append(f"{page.relative_to(ROOT)}: {why}")
    assert seen > 40 and not problems, "\n".join(problems)


def test_every_relative_link_points_at_a_file():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 220
