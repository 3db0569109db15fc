"""The `inferdesk` command: no arguments opens the desktop app, anything else is the
engine's command line (``inference.cli``), which never imports Qt.

This module sits above both layers, so the engine does not point up at the app."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args:
        from inference.cli import main as cli_main

        return cli_main(args, whole_process=argv is None)
    return open_app()


def open_app() -> int:
    """Check that Qt can start here, then run the app; one line and exit 2 if it cannot."""
    from gui.preflight import check

    problem = check()
    if problem is not None:
        print(f"inferdesk: error: {problem.message}", file=sys.stderr)
        return 2
    from gui.app import main as app_main

    return app_main()


if __name__ == "__main__":
    raise SystemExit(main())
