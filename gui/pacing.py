"""How often a streamed view may redraw: within a share of what the engine gets.

A reply is re-rendered whole (Markdown to rich text, layout, paint), so each render costs
more as the reply grows: ~10 ms of the GUI thread at 100 words, ~20 ms at 400, ~50 ms at
1,100 (the Xeon, offscreen). At a fixed 20 renders a second the window took a third of a
core while a reply streamed, and on a 2-core machine the engine ran that much slower.

A :class:`RenderPacer` lets a render through only while the GUI thread's CPU time since
the previous one stays within ``share`` of the time since it, so renders space out as
they grow dearer, and never more than ``longest_s`` apart. While the rest of the process
(the engine) runs, that time is the smaller of the wall time and the CPU time the rest
got: on a machine busy with other programs the engine gets a fraction of a core, and the
window's part shrinks with it rather than taking from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

SHARE = 0.2  # what streaming views may cost the GUI thread, paint included
LONGEST_S = 1.0  # a streamed view shows new text at least this often
IDLE = 0.1  # the rest of the process using less than this of a core is idle: no engine to spare

Clock = Callable[[], float]


class RenderPacer:
    def __init__(self, share: float = SHARE, longest_s: float = LONGEST_S,
                 clocks: tuple[Clock, Clock, Clock] = (
                     time.perf_counter, time.thread_time, time.process_time)):
        """``clocks``: the wall clock, the calling thread's CPU clock and the process's
        CPU clock, in seconds."""
        self.share, self.longest_s = share, longest_s
        self._clocks = clocks
        self._last: tuple[float, float, float] | None = None

    def restart(self) -> None:
        """A new stream: its first render goes through."""
        self._last = None

    def due(self) -> bool:
        """Whether to render now (call on the GUI thread; a yes starts the next interval)."""
        now = tuple(clock() for clock in self._clocks)
        if self._last is not None:
            wall, mine, process = (a - b for a, b in zip(now, self._last, strict=True))
            rest = process - mine
            basis = wall if rest < IDLE * wall else min(wall, rest)
            if wall < self.longest_s and mine > self.share * basis:
                return False
        self._last = now
        return True
