"""What isoflop asks of the processes it starts."""

from __future__ import annotations

import ctypes
import signal
import sys


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> None:
    """Ask Linux to send `sig` to this process when its parent dies, however it dies: a head's Ray
    under the head process, a run under its Ray job supervisor, a learner rank under its run (which
    takes SIGKILL: a rank left waiting in a collective would never read a gentler signal)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
