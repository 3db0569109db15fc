"""Where a bench figure came from: the CPU, the commit, the date; raw figures as JSON files."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def git_commit() -> str | None:
    """The checkout's commit (``git rev-parse HEAD``, with ``+dirty`` when files differ from
    it), or None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def write_record(out_dir: str | Path, name: str, script: str, fields: dict[str, Any]) -> Path:
    """A benchmark script's raw figures as ``out_dir/<UTC minute>-<name>.json``, with the
    command that made them, the CPU, the commit, the load average and the date."""
    out = Path(out_dir) / f"{time.strftime('%Y%m%d-%H%M')}-{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": f"python {script} " + " ".join(sys.argv[1:]), "cpu": cpu_info(),
        "commit": git_commit(),
        "load_avg": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), **fields},
        indent=1))
    print(f"wrote {out}")
    return out


def cpu_info() -> dict[str, Any]:
    """The CPU's model name and the vector extensions that decide which kernels run."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine()):
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = value.split()
    except OSError:
        pass
    wanted = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni",
              "avx512_bf16", "amx_tile", "neon", "asimd", "asimddp", "i8mm", "sve")
    return {"model": model, "vector_flags": [f for f in wanted if f in flags]}


def machine() -> dict[str, Any]:
    """The machine a bench ran on, as its JSON records it."""
    cpu = cpu_info()
    return {"cpu": cpu["model"], "vector_flags": cpu["vector_flags"], "cores": os.cpu_count(),
            "python": platform.python_version(),
            # Other processes' load skews multi-threaded timings badly.
            "loadavg_1m_at_start": round(os.getloadavg()[0], 2)}
