"""numba imported without the two modules it imports only for rarely taken paths (yaml,
importlib.metadata): each is imported at its first use, and is then the ordinary module."""

import subprocess
import sys
import textwrap

import pytest


def run_fresh(code: str) -> str:
    """``code`` in a new interpreter (numba not imported yet); its stdout."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()


def test_numba_imports_without_yaml_or_importlib_metadata_until_they_are_used():
    pytest.importorskip("yaml")
    out = run_fresh("""
        import sys
        from inference.numba_import import import_numba
        import_numba()
        print("yaml" in sys.modules, "importlib.metadata" in sys.modules)
        import numba.core.config as config, numba.core.entrypoints as entrypoints
        print(config.yaml.safe_load("a: 1"), "yaml" in sys.modules)
        import yaml
        print(yaml is sys.modules["yaml"], yaml.safe_load is config.yaml.safe_load)
        entrypoints.init_all()  # numba's scan for extensions, through the stand-in
        import importlib, importlib.metadata
        print(importlib.metadata is sys.modules["importlib.metadata"],
              entrypoints.importlib_metadata.entry_points is importlib.metadata.entry_points)
    """)
    assert out.splitlines() == ["False False", "{'a': 1} True", "True True", "True True"]


def test_a_module_imported_before_numba_stays_itself():
    out = run_fresh("""
        import sys, importlib.metadata as before
        from inference.numba_import import import_numba
        import_numba()
        import numba.core.entrypoints as entrypoints
        print(entrypoints.importlib_metadata is before is sys.modules["importlib.metadata"])
    """)
    assert out == "True"


def test_the_cli_and_the_cpu_backend_import_numba_through_it():
    out = run_fresh("""
        import sys
        import inference.backends.cpu  # noqa: F401
        print("importlib.metadata" in sys.modules)
    """)
    assert out == "False"
