"""The goldens' readers and bars, from scripts/goldens_io.py (the parity scripts share them)."""

from scripts.goldens_io import *  # noqa: F403
