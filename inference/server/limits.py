"""Limits of the server that its command line and its scheduler both read."""

MAX_PARALLEL = 8  # cpu: rows the mat-vec computes one by one (cpu.MATVEC_ROWS)
SHUTDOWN_S = 5.0  # on SIGTERM/Ctrl-C, open requests get this long before they are cut
