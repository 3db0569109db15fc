"""What ships and what does not: the installed package (gui/, inference/, kernels/,
resources/) imports neither tests/ nor scripts/, scripts/ does not import tests/, and the
host emulator of the CUDA kernels (a test tool) is not in the package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ("gui", "inference", "kernels", "resources")


def _sources(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def _imported(tree: ast.AST) -> set[str]:
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    return {n.split(".")[0] for n in names}


def test_package_imports_neither_tests_nor_scripts() -> None:
    bad = [f"{p.relative_to(ROOT)}: {sorted(m & {'tests', 'scripts'})}"
           for p in _sources(*PACKAGE)
           if (m := _imported(ast.parse(p.read_text(), str(p)))) & {"tests", "scripts"}]
    assert bad == []


def test_scripts_do_not_import_tests() -> None:
    bad = [str(p.relative_to(ROOT)) for p in _sources("scripts")
           if "tests" in _imported(ast.parse(p.read_text(), str(p)))]
    assert bad == []


def test_the_kernel_emulator_is_not_in_the_package() -> None:
    emulated = [f"{p.relative_to(ROOT)}: {n.name}" for p in _sources(*PACKAGE)
                for n in ast.walk(ast.parse(p.read_text(), str(p)))
                if isinstance(n, ast.ClassDef) and n.name.startswith("Emulated")]
    assert emulated == []
    assert not list((ROOT / "kernels").rglob("cuda_emu.h"))
