"""What a job's log and Ray's word on its end say of why it failed, in one line: the dispatcher's
failure reasons and the preflight's read the same lines."""

from __future__ import annotations

import re
from pathlib import Path

# The CLI's own one-line error, or a Python exception line as a traceback ends with it
# ("ValueError: ...", "torch.OutOfMemoryError: ...").
_EXCEPTION = re.compile(r"^(error: |([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|Killed)\b)")


def last_exception(log: str) -> str | None:
    """The last exception line of a log (an `error:` line of isoflop's, a traceback's last line),
    not the traceback's last frame; None where there is none."""
    for line in reversed(log.splitlines()):
        if _EXCEPTION.match(line.strip()):
            return line.strip().removeprefix("error: ")
    return None


def job_message(message: str, log: Path | None = None) -> str:
    """Ray's word on a job's end, one line: without the log tail it appends to a failed job's
    (up to 20,000 characters), of which the last exception line is kept, and the path of the
    job's whole log instead (where it has one)."""
    head, cut, tail = message.partition(", last available logs")
    line = " ".join(head.split())
    if not cut:
        return line
    exception = last_exception(tail)
    return line + (f"; {exception}" if exception else "") + (f" (log: {log})" if log else "")
