"""`inferdesk bench`: fixed workloads timed on the engine and on its peers, as JSON.

- :mod:`.workloads`: the prompt and sentences every mode runs;
- :mod:`.llm`, :mod:`.embed`: a warmed process's prefill, decode and embedding speed;
- :mod:`.e2e`: whole fresh processes, as a user runs them (load, first token, memory);
- :mod:`.kernels`: what explains a decode speed (time outside ops, mat-vec speed by type);
- :mod:`.peers`: llama-cpp-python and sentence-transformers on the same workloads;
- :mod:`.rounds`: interleaved rounds and fresh processes per side;
- :mod:`.record`: CPU, commit and date in each JSON record;
- :mod:`.command`: the subcommand's arguments (``python -m inference.bench``).

Names are imported on first use, so a child process that runs one side imports only it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"workloads": "workloads", "BENCH_DIR": "workloads", "write_record": "record",
            "cpu_info": "record", "git_commit": "record",
            "weight_bytes_per_token": "llm", "_import_backends": "llm"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'inference.bench' has no attribute {name!r}")
    return getattr(importlib.import_module(f"inference.bench.{_EXPORTS[name]}"), name)
