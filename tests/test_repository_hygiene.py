"""The repository speaks of the product: no words of how it was built (work sessions, the
tracker's issues, helpers, the build machine) and no absolute paths of a machine's folders
in any tracked file or file name.

Each rule is a pattern over one line; a few product uses of the same words are allowed by
name below (a desktop session, the app's session, pytest's session, the cpu backend's
share-out threads, CPU paths inside the arm64 userland of scripts/arm64_emulated.sh).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (name, pattern): each is searched case-insensitively unless it sets its own flags.
RULES: list[tuple[str, re.Pattern[str]]] = [
    ("a numbered work session", re.compile(r"\bsessions?[ _-]?\d+", re.I)),
    ("a work session", re.compile(r"\bsessions?\b", re.I)),
    ("a tracker's issue", re.compile(r"\bissue\b|\bissue's\b|\bissues? ?#?\d", re.I)),
    ("helpers", re.compile(r"\bhelpers?\b|\bhelpers'", re.I)),
    ("a virtual machine by its short name", re.compile(r"\bVMs?\b")),
    ("the build machine", re.compile(r"\b(this|the developer's|this project's) machines?\b"
                                     r"|\bthe lead\b", re.I)),
    ("an absolute path of a machine's folders",
     re.compile(r"(?<![\w.~/$-])/(work|tmp|root|home|Users)(?=/|\b)")),
]

# Product uses of the same words: removed from a line before the rules look at it.
ALLOWED = re.compile("|".join([
    r"\b(wayland|desktop|x11|graphical|login) session\b",   # the user's desktop
    r"\bsession cookies?\b",
    r"\bnothing from (this|the) session\b", r"\bback this session\b",  # the app's run
    r"\b(a|any|as a) session\b(?![ _-]?\d)", r"\ba session's worth\b",
    r"\bpytest[._]session\w*", r"\bsession\.(items|config)\b", r"\bsession: pytest\b",
    r"scope=[\"']session[\"']", r"\bonce per session\b",     # pytest's session
    r"\bhelper (threads?|functions?)\b", r"\b(test|runtime) helpers?\b",  # code's senses
    r"^\s*#\s*-+\s*helpers\s*-+\s*$",                         # a section of helper functions
    r"/tmp/\.X11-unix\b",                                    # X11's socket folder
    r"\b(blocks?|warps?|threads?|lanes?|kernels?|it|they) issues? (the|a|an|one|\d)",  # verb
    r"\bcannot run on this machine\b", r"\bthis machine's cores\b",  # the running machine
]), re.I)

# Files whose own subject is a word above, with the rules that do not apply to them.
EXEMPT: dict[str, set[str]] = {
    "tests/test_repository_hygiene.py": {rule for rule, _ in RULES},  # the rules themselves
    # Paths inside the arm64 userland the script builds (its /root, /tmp), not a host's.
    "scripts/arm64_emulated.sh": {"an absolute path of a machine's folders"},
    # pytest's session (fixtures, hooks, the run's start and end); numbered ones still fail.
    "tests/*.py": {"a work session"},
}
# Files whose rewrite by their owners is under way, not checked until it is done: take a file
# off this list once `hits_in` finds nothing in it.
PENDING: set[str] = set()

# Result files named for a work session ("-s16", "session15") rather than what they hold.
NAME_RULE = re.compile(r"session|[-_]s\d{1,2}(?=[-_.])", re.I)
BINARY_SUFFIXES = {".png", ".gguf", ".npz", ".npy", ".safetensors", ".sqlite3", ".so"}


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the rules apply to the repository's tracked files")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def exempt(name: str) -> set[str]:
    return set().union(*(rules for glob, rules in EXEMPT.items() if fnmatch(name, glob)))


# Every rule needs one of these words: lines without any are not looked at further.
TRIGGER = re.compile(r"session|issue|helper|VM|machine|lead|/(work|tmp|root|home|Users)", re.I)


def hits_in(name: str, text: str) -> list[str]:
    """Each line of ``text`` that breaks a rule, as 'name:line: rule: the line'."""
    if not TRIGGER.search(text):
        return []
    skip = exempt(name)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        # Each rule is judged around its trigger word (a data file's line can be long).
        for window in {line[max(0, m.start() - 120):m.end() + 120]
                       for m in TRIGGER.finditer(line)}:
            rest = ALLOWED.sub(" ", window)
            broken = [rule for rule, pattern in RULES
                      if rule not in skip and pattern.search(rest)]
            if broken:
                found.append(f"{name}:{number}: {broken[0]}: {window.strip()[:160]}")
                break
    return found


def test_rules_catch_what_they_name():
    """Each rule fires on its kind of line and lets the product's own uses pass."""
    bad = ["Since session 16 decode attention reads", "Figures, helpers paused", "the VM's phase",
           "the issue's bars", "(issue 12)", "whatever the developer's machine has",
           "repo: /work/main @ 05d3569", "logs: /tmp/inferdesk-load.y6AHdv", "HOME=/root",
           "on this project's machine", "Not changed this session.", "helper emb10",
           "the helper's server benchmarks", "# issue 33 items 3 and 4"]
    good = ["In a Wayland session the wayland plugin is tried first",
            "nothing from this session will be saved", "a session cookie", "GVM is a word",
            "/usr/bin/env", "/dev/null", "/proc/cpuinfo", "docs/bench-results/x.json",
            "it issues a quarter of the float loads", "A helper thread that spins",
            'Path(f"/tmp/.X11-unix/X{display[1:]}")', "https://example.org/tmp/x",
            "$TMPDIR/x", "scope=\"session\"", "# --- helpers ----------", "a test helper",
            "the blocks issue the loads"]
    assert [line for line in bad if not hits_in("x.md", line)] == []
    assert [line for line in good if hits_in("x.md", line)] == []


def file_hits(name: str) -> list[str]:
    hits = [f"{name}: file name: named for a work session"] \
        if NAME_RULE.search(Path(name).name) else []
    path = ROOT / name
    if path.suffix in BINARY_SUFFIXES or not path.is_file():
        return hits
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return hits
    return hits + hits_in(name, data.decode("utf-8", errors="replace"))


def test_tracked_files_speak_of_the_product():
    """No tracked file's name or text uses the words of how it was built, or a machine's
    absolute folders: write paths relative to the repository."""
    hits = [h for name in tracked_files() if name not in PENDING for h in file_hits(name)]
    assert hits == [], f"{len(hits)} lines:\n" + "\n".join(hits)
