"""Exclusive locks on kvsim's folders: a run's results folder, a sweep folder, a collection.

A lock is a file (``.kvsim_running`` in a run's folder, ``.kvsim_sweep_lock`` in a sweep
folder, ...) on which the holder keeps an exclusive ``flock`` for as long as it works there.
The operating system releases it when the holder ends in any way (a normal end, an exception,
SIGKILL, the OOM killer), so a lock is never left behind: no process id is checked and a killed
holder's lock cannot be taken by two processes at once. The file holds ``"<host> <pid>"`` of
its holder, for the message of a refused process only. On a local filesystem and on NFS
(Linux emulates ``flock`` with NFS's byte-range locks) the lock works across processes and,
on NFS, across hosts.

:func:`hold` takes a lock without waiting and raises :class:`sim.errors.Busy` (naming the holder) when
another process holds it; :meth:`Held.release` deletes the file while still holding it. A
process that opened the file before it was deleted and then wins the ``flock`` finds that the
path now names another file (or none) and tries again, so at most one process ever holds the
lock of a path. Where the filesystem has no ``flock`` (some FUSE mounts), :func:`hold` returns
an unlocked :class:`Held` whose ``locked`` is False and whose ``why`` says so.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from .errors import Busy

try:
    import fcntl
except ImportError:  # pragma: no cover - (Windows: no flock; runs are not guarded there)
    fcntl = None

# errno values of a flock that another process holds
_CONTENDED = {errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES}


class Held:
    """A lock this process holds (:func:`hold`). ``locked`` is False where the filesystem
    has no ``flock`` (``why`` then says so); :meth:`release` is then a no-op."""

    def __init__(self, path: Path, fd: int | None, why: str | None = None):
        self.path = Path(path)
        self._fd = fd
        self.locked = fd is not None
        self.why = why

    def release(self) -> None:
        """Delete the lock file (when it is still this lock's) and let the lock go. Safe to
        call more than once."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                os.unlink(self.path)
        except OSError:
            pass  # (gone already, or a read-only folder: the file stays, unlocked)
        finally:
            os.close(fd)

    def __enter__(self) -> "Held":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def holder_of(path: Path) -> str:
    """Who holds the lock file ``path``, from its text: ``"process PID on HOST"``, or ``"a
    process that is starting"`` when it is empty or unreadable."""
    try:
        words = Path(path).read_text(errors="replace").split()
    except OSError:
        words = []
    if len(words) == 2 and words[1].isdigit():
        return f"process {words[1]} on {words[0]}"
    return "a process that is starting"


def hold(path: Path) -> Held:
    """Take the exclusive lock of the file ``path`` (created if missing, in an existing
    folder) without waiting, write this host and process id into it and return it. Raises
    :class:`Busy` when another process (or another :func:`hold` of this process) holds it, and
    OSError when the file cannot be created or written (a read-only or full filesystem; no
    lock is then left)."""
    path = Path(path)
    if fcntl is None:  # pragma: no cover
        return Held(path, None, "this platform has no flock")
    for _ in range(20):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in _CONTENDED:
                raise Busy(path, holder_of(path)) from None
            # (ENOLCK, ENOTSUP, EINVAL: a filesystem without flock)
            return Held(path, None, f"{path.parent} does not support file locks "
                                    f"({errno.errorcode.get(e.errno, e.errno)})")
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # (its holder deleted it as it let go: lock the file at the path now)
            os.close(fd)
            continue
        held = Held(path, fd)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        except OSError as e:
            held.release()
            if e.filename is None:
                e.filename = str(path)
            raise
        return held
    raise Busy(path, "processes that keep taking and letting go of it")


def held_by_another(path: Path) -> bool:
    """Whether a process other than this one holds the lock file ``path`` now (:func:`is_held`,
    its text naming another host or process id than this process's)."""
    if not is_held(path):
        return False
    try:
        words = Path(path).read_text(errors="replace").split()
    except OSError:
        return True
    return words != [socket.gethostname(), str(os.getpid())]


def is_held(path: Path) -> bool:
    """Whether some process holds the lock file ``path`` now (False when there is no such
    file). The probe takes a shared ``flock`` for an instant: it never blocks and leaves the
    file as it is."""
    if fcntl is None:  # pragma: no cover
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in _CONTENDED
    finally:
        os.close(fd)
    return False
