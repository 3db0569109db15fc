"""When a cached kernel is stale: its stamp covers every file of ours it imports.

numba's on-disk cache stamps a kernel with the hash of the one source file that defines
it. A kernel's machine code also holds what it calls and reads from other files (the IR
intrinsics, the layout constants, the quantizer), so after an update that changes only
those files numba would load the old code: wrong results at best, a crash at worst. The
locators below stamp a kernel of this repository with the hashes of its file and of every
repository module it imports, directly or through others; anything else keeps numba's own
locators. Modules count by their import statements (``from inference... import``,
``import kernels...``), anywhere in the file.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from pathlib import Path

from numba.core import caching

ROOT = Path(__file__).resolve().parents[3]  # holds the packages below
PACKAGES = ("inference", "kernels")


def _module_file(name: str) -> Path | None:
    """The source file of the repository module ``name`` (a dotted name), if there is one."""
    if name.split(".", 1)[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


# ``import a.b[, c]`` and ``from [.]a.b import x[, y]`` (names possibly in parentheses over
# several lines), at any indentation: cheaper than parsing the file, and enough for imports.
_IMPORT = re.compile(r"^[ \t]*(?:import[ \t]+([\w., \t]+)|from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+"
                     r"(\([^)]*\)|[^\n]*))", re.MULTILINE)


@cache
def _imports(path: Path) -> frozenset[Path]:
    """The repository files ``path`` imports: ``import m`` gives m, ``from m import n``
    gives n where n is a submodule, else m; relative imports resolved against ``path``'s
    package. A package's ``__init__`` counts only where a name comes from it."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found: list[Path | None] = []
    for plain, module, listed in _IMPORT.findall(path.read_text(encoding="utf-8")):
        if plain:
            found += [_module_file(n.split(" as ")[0].strip()) for n in plain.split(",")]
            continue
        level = len(module) - len(module.lstrip("."))
        module = module.lstrip(".")
        if level:
            module = ".".join([*package[: len(package) - level + 1], *([module] if module else [])])
        for alias in re.sub(r"#[^\n]*", "", listed).strip("()").replace("\\", " ").split(","):
            alias = alias.split(" as ")[0].strip()
            if alias and alias != "*":
                found.append(_module_file(f"{module}.{alias}") or _module_file(module))
    return frozenset(f for f in found if f is not None)


@cache
def closure(path: Path) -> tuple[Path, ...]:
    """``path`` and every repository file it imports, transitively, sorted."""
    seen: set[Path] = set()
    todo = [path.resolve()]
    while todo:
        file = todo.pop()
        if file in seen:
            continue
        seen.add(file)
        todo.extend(_imports(file) - seen)
    return tuple(sorted(seen))


@cache
def stamp(path: Path) -> str:
    """The hash of the contents of ``closure(path)``, each with its repository path."""
    digest = hashlib.sha256()
    for file in closure(path):
        digest.update(str(file.relative_to(ROOT)).encode())
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def _ours(py_file: str) -> bool:
    try:
        rel = Path(py_file).resolve().relative_to(ROOT)
    except ValueError:
        return False
    return rel.parts[0] in PACKAGES


def _stamped(base: type) -> type:
    """numba's locator ``base``, for our files only, with :func:`stamp` as the source stamp."""

    class Locator(base):
        @classmethod
        def from_function(cls, py_func, py_file):  # noqa: ANN001, ANN206 (numba's API)
            return super().from_function(py_func, py_file) if _ours(py_file) else None

        def get_source_stamp(self) -> str:
            return stamp(Path(self._py_file))

    Locator.__name__ = Locator.__qualname__ = f"Closure{base.__name__}"
    return Locator


# In numba's order: NUMBA_CACHE_DIR when set, else __pycache__ beside the source, else the
# user-wide cache (a read-only install). Each gives up on files that are not ours.
LOCATORS = tuple(_stamped(getattr(caching, name, None) or getattr(caching, "_" + name))
                 for name in ("UserProvidedCacheLocator", "InTreeCacheLocator",
                              "UserWideCacheLocator"))  # older numba: "_" first


def install() -> None:
    """Put :data:`LOCATORS` ahead of numba's own (once); before any kernel is decorated."""
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    classes = impl._locator_classes
    if classes[: len(LOCATORS)] != list(LOCATORS):
        classes[:0] = LOCATORS
