"""The repository speaks of the product: its tracked files, names and text, carry no record
of how the product was made (work periods, tracker entries, assistants, the build host) and
no absolute paths of one machine's folders; paths are relative to the repository.

Each rule is a pattern over one line; the product's own uses of the same words (the user's
desktop login, the app's run, pytest's scope, the cpu backend's share-out threads, paths
inside the arm64 userland of scripts/arm64_emulated.sh) are allowed by name below.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The words the rules look for, spelled in pieces so that this file, which must name them,
# does not read as using them.
SES, ISS, HELP = "ses" "sion", "is" "sue", "hel" "per"
DIRS = "|".join(("wo" "rk", "t" "mp", "ro" "ot", "ho" "me", "Us" "ers"))

# (name, pattern): each is searched case-insensitively unless it sets its own flags.
RULES: list[tuple[str, re.Pattern[str]]] = [
    ("a numbered work period", re.compile(rf"\b{SES}s?[ _-]?\d+", re.I)),
    ("a work period", re.compile(rf"\b{SES}s?\b", re.I)),
    ("a tracker entry", re.compile(rf"\b{ISS}\b|\b{ISS}'s\b|\b{ISS}s? ?#?\d", re.I)),
    ("assistants", re.compile(rf"\b{HELP}s?\b|\b{HELP}s'", re.I)),
    ("a virtual machine by its short name", re.compile(r"\bVMs?\b")),
    ("the build host", re.compile(r"\b(this|the developer's|this project's) machines?\b"
                                  r"|\bthe lead\b", re.I)),
    ("an absolute path of a machine's folders",
     re.compile(rf"(?<![\w.~/$-])/({DIRS})(?=/|\b)")),
]

# Product uses of the same words: removed from a line before the rules look at it.
ALLOWED = re.compile("|".join([
    rf"\b(wayland|desktop|x11|graphical|login) {SES}\b",   # the user's desktop
    rf"\b{SES} cookies?\b",
    rf"\bnothing from (this|the) {SES}\b", rf"\bback this {SES}\b",  # the app's run
    rf"\b(a|any|as a) {SES}\b(?![ _-]?\d)", rf"\ba {SES}'s worth\b",
    rf"\bpytest[._]{SES}\w*", rf"\b{SES}\.(items|config)\b", rf"\b{SES}: pytest\b",
    rf"scope=[\"']{SES}[\"']", rf"\bonce per {SES}\b",     # pytest's scope
    rf"\b{HELP} (threads?|functions?)\b", rf"\b(test|runtime) {HELP}s?\b",  # code's senses
    rf"^\s*#\s*-+\s*{HELP}s\s*-+\s*$",                    # a section of such functions
    r"/t" r"mp/\.X11-unix\b",                                # X11's socket folder
    rf"\b(blocks?|warps?|threads?|lanes?|kernels?|it|they) {ISS}s? (the|a|an|one|\d)",  # verb
    r"\bcannot run on this machine\b", r"\bthis machine's cores\b",  # the running machine
]), re.I)

# Files whose own subject is a word above, with the rules that do not apply to them.
EXEMPT: dict[str, set[str]] = {
    "tests/test_repository_hygiene.py": {rule for rule, _ in RULES},  # the rules themselves
    # Paths inside the arm64 userland the script builds, not a host's.
    "scripts/arm64_emulated.sh": {"an absolute path of a machine's folders"},
    # pytest's scope of the same name (fixtures, hooks); numbered ones still fail.
    "tests/*.py": {"a work period"},
}
# Files not checked yet: empty, and a file goes here only while its rewrite is under way.
PENDING: set[str] = set()

# Result files named for a work period ("-s16") rather than what they hold.
NAME_RULE = re.compile(SES + r"|[-_]s\d{1,2}(?=[-_.])", re.I)
BINARY_SUFFIXES = {".png", ".gguf", ".npz", ".npy", ".safetensors", ".sqlite3", ".so"}


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the rules apply to the repository's tracked files")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def exempt(name: str) -> set[str]:
    return set().union(*(rules for glob, rules in EXEMPT.items() if fnmatch(name, glob)))


# Every rule needs one of these words: lines without any are not looked at further.
TRIGGER = re.compile(rf"{SES}|{ISS}|{HELP}|VM|machine|lead|/({DIRS})", re.I)


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
    bad = [f"Since {SES} 16 decode attention reads", f"Figures, {HELP}s paused",
           "the VM's phase", f"the {ISS}'s bars", f"({ISS} 12)",
           "whatever the developer's machine has", "repo: /wo" "rk/main @ 05d3569",
           "logs: /t" "mp/inferdesk-load.y6AHdv", "HOME=/ro" "ot",
           "on this project's machine", f"Not changed this {SES}.", f"{HELP} emb10",
           f"the {HELP}'s server benchmarks", f"# {ISS} 33 items 3 and 4"]
    good = [f"In a Wayland {SES} the wayland plugin is tried first",
            f"nothing from this {SES} will be saved", f"a {SES} cookie", "GVM is a word",
            "/usr/bin/env", "/dev/null", "/proc/cpuinfo", "docs/bench-results/x.json",
            f"it {ISS}s a quarter of the float loads", f"A {HELP} thread that spins",
            'Path(f"/t' 'mp/.X11-unix/X{display[1:]}")', "https://example.org/t" "mp/x",
            "$TMPDIR/x", f"scope=\"{SES}\"", f"# --- {HELP}s ----------", f"a test {HELP}",
            f"the blocks {ISS} the loads"]
    assert [line for line in bad if not hits_in("x.md", line)] == []
    assert [line for line in good if hits_in("x.md", line)] == []


def file_hits(name: str) -> list[str]:
    hits = [f"{name}: file name: named for a work period"] \
        if NAME_RULE.search(Path(name).name) else []
    path = ROOT / name
    if path.suffix in BINARY_SUFFIXES or not path.is_file():
        return hits
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return hits
    return hits + hits_in(name, data.decode("utf-8", errors="replace"))


def test_tracked_files_speak_of_the_product():
    """No tracked file's name or text records how the product was made, or names a
    machine's absolute folders: paths are relative to the repository."""
    hits = [h for name in tracked_files() if name not in PENDING for h in file_hits(name)]
    assert hits == [], f"{len(hits)} lines:\n" + "\n".join(hits)
