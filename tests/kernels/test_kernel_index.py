"""kernels/cuda/KERNELS.md lists every kernel by name and module (each name is also written
out in its module's source, so grep finds its definition).

    python -m tests.kernels.test_kernel_index     # rewrites the index from the sources
"""

from __future__ import annotations

from kernels.cuda.device import CUDA_DIR, MODULES, source_path
from tests.kernels.emulator.build import build

INDEX = CUDA_DIR / "KERNELS.md"
_HEAD = ("# CUDA kernels by module\n\n"
         "Every `extern \"C\"` kernel of kernels/cuda: the name a launch "
         "uses (`dev.launch(module, name, ...)`) and the module (`<module>.cu`) that defines "
         "it. Kept equal to the sources by tests/kernels/test_kernel_index.py.\n")


def index_text() -> str:
    lines = [_HEAD]
    for m in MODULES:
        lines.append(f"\n## {m}.cu\n\n")
        lines.extend(f"- `{name}`\n" for name in sorted(build(source_path(m))[1]))  # cached
    return "".join(lines)


def test_the_index_lists_every_kernel() -> None:
    assert INDEX.read_text() == index_text(), (
        "kernels/cuda/KERNELS.md is stale: python -m tests.kernels.test_kernel_index")


if __name__ == "__main__":
    INDEX.write_text(index_text())
