"""Every `python launch/<script>.py --flag ...` command written in the docs names flags
its script defines (a renamed or mistyped flag fails at once with "Unknown command line
flag"; CONTRIBUTING.md once gave `--model` for `--models`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    "README.md",
    "CONTRIBUTING.md",
    *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("docs/*.md")),
]
# A command, its continuation lines joined; the flags after a lone `--` belong to the
# program it starts (launch/multiworker.py passes them to launch/train.py).
COMMAND = re.compile(r"python3? (launch/\w+\.py)([^\n`|]*)")


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(file, script, flag names) of each command in the docs."""
    found = []
    for name in DOCS:
        text = (ROOT / name).read_text(encoding="utf-8").replace("\\\n", " ")
        for match in COMMAND.finditer(text):
            own = match.group(2).split(" -- ")[0]
            found.append((name, match.group(1), re.findall(r"(?<!\S)--(\w+)", own)))
    return found


def defined_flags(script: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, script, "--helpfull"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    ).stdout
    return set(re.findall(r"^\s+--(?:\[no\])?(\w+)", out, flags=re.MULTILINE))


def test_documented_commands_use_flags_their_scripts_define() -> None:
    commands = documented_commands()
    scripts = sorted({script for _, script, _ in commands})
    flags = {script: defined_flags(script) for script in scripts}
    for script, names in flags.items():
        assert "helpfull" in names or len(names) > 5, (script, "no flags read")
    unknown = [
        (name, script, flag)
        for name, script, used in commands
        for flag in used
        if flag not in flags[script]
    ]
    assert not unknown
    # The check ran over the docs' commands of every script (counted, so that a broken
    # pattern cannot pass by matching nothing).
    assert len(commands) >= 30 and {"launch/train.py", "launch/ablate_step.py"} <= set(scripts)
    assert sum(len(used) for _, _, used in commands) >= 60
