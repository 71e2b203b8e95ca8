"""What the ``kvsim`` command prints: whole lines on streams that parallel jobs share
(:func:`write_line`) and the one-line error for a failure of the machine rather than of kvsim
(:func:`resource_error`). Imports nothing of kvsim."""

from __future__ import annotations

import errno


def write_line(stream, text: str) -> None:
    """Write ``text`` and its newline to ``stream`` in one write, flushed before and after.

    A sweep's parallel jobs (the joblib launcher's workers) share one stdout and stderr:
    ``print`` writes the text and the newline apart, so two jobs' lines could join on one line
    (``results: /a/0results: /a/1``). One write of a line under the pipe's atomic size
    (PIPE_BUF, 4,096 bytes on Linux) reaches the pipe whole."""
    stream.flush()
    stream.write(text + "\n")
    stream.flush()


# write errors that are the machine's, not kvsim's: one line naming the file, no traceback
_RESOURCE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def resource_error(e: BaseException) -> str | None:
    """The one-line error for an exception that is the machine's, not kvsim's: out of memory
    (MemoryError), a full disk or quota (ENOSPC, EDQUOT), the file size limit (EFBIG, ``ulimit
    -f``) or a read-only filesystem (EROFS), naming the file and what to do; None for any
    other exception."""
    if isinstance(e, MemoryError):
        return ("out of memory (MemoryError): the simulation needed more memory than this "
                "machine had free; expected more free memory: run fewer jobs at once "
                "(hydra.launcher.n_jobs), a shorter trace (trace.max_requests) or a smaller "
                "pool (cache.num_gpu_blocks)")
    if isinstance(e, OSError) and e.errno in _RESOURCE_ERRNOS:
        what = {errno.ENOSPC: "no space left on the device",
                errno.EDQUOT: "the disk quota is used up",
                errno.EFBIG: "the file size limit (ulimit -f) is reached",
                errno.EROFS: "the filesystem is read-only"}[e.errno]
        where = f" writing {e.filename}" if e.filename else ""
        return (f"{what}{where} ({errno.errorcode[e.errno]}: {e.strerror}); expected room "
                f"for the results: free space (or pick another output.dir), then run the "
                f"same command with output.skip_completed=true")
    return None
