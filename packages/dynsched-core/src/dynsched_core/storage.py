"""Writes that cannot half-happen, and one run per output folder (stdlib only).

- `atomic_write_bytes` / `atomic_write_text` / `atomic_writer`: the data goes to a
  temporary file in the target's folder, is flushed and fsynced, replaces the target with
  `os.replace` and the folder is fsynced: a reader (or a resumed run after a crash or a
  full disk) sees the old file or the new one, never a mix; on failure the old file is
  left as it was and the temporary file is removed.
- `append_line`: one JSON-lines row written whole with one ``write`` and fsynced.
- `read_json_lines` drops a truncated (unparseable) last line; `trim_json_lines` keeps
  the rows a predicate accepts (e.g. steps up to a checkpoint's) and rewrites the file
  atomically.
- `RunLock`: an output folder held by a live run (``fcntl.flock`` on ``.dynsched.lock``,
  holding the holder's pid, host and start time). The kernel frees the lock when the
  holder dies, so a crashed run's lock is taken over (with a note).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

__all__ = [
    "LOCK_NAME",
    "RunLock",
    "RunLockBusyError",
    "append_line",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_writer",
    "fsync_dir",
    "read_json_lines",
    "trim_json_lines",
]

logger = logging.getLogger(__name__)

#: Name of the lock file a run keeps in each folder it writes to.
LOCK_NAME = ".dynsched.lock"


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (a rename in it) to disk (no-op where unsupported)."""
    try:
        fd = os.open(os.fspath(folder) or ".", os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. a platform without folder fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on folders
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """A binary file whose content replaces ``path`` whole when the block ends.

    The content goes to a temporary file in the same folder (created if missing); at the
    end of the block it is flushed, fsynced, renamed over ``path`` and the folder is
    fsynced. If the block or any of these raises (e.g. ``OSError`` ENOSPC), ``path`` is
    left as it was and the temporary file is removed.
    """
    target = os.fspath(path)
    folder = os.path.dirname(target) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` whole (see `atomic_writer`)."""
    with atomic_writer(path) as fh:
        fh.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) whole (see `atomic_writer`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def append_line(path: str | os.PathLike[str], line: str, *, fsync: bool = True) -> None:
    """Append one line (a newline is added) with a single ``write``, then fsync.

    A crash or a full disk can at worst leave a truncated last line, which
    `read_json_lines` drops.
    """
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_json_lines(path: str | os.PathLike[str]) -> list[Any]:
    """The JSON values of a JSON-lines file, skipping blank and unparseable lines (the
    truncated last line a crash can leave)."""
    out: list[Any] = []
    with open(path, "rb") as fh:
        for raw in fh:
            text = raw.strip()
            if not text:
                continue
            try:
                out.append(json.loads(text))
            except ValueError:
                logger.info("%s: dropping an unreadable (truncated) line", os.fspath(path))
    return out


def trim_json_lines(path: str | os.PathLike[str], keep: Callable[[Any], bool]) -> int:
    """Keep the rows of a JSON-lines file that ``keep`` accepts; drop the others and any
    unparseable line; rewrite the file atomically (only when something is dropped).

    Returns:
        The number of lines dropped (0 when the file does not exist).
    """
    if not os.path.isfile(path):
        return 0
    with open(path, "rb") as fh:
        lines = [x for x in fh.read().splitlines() if x.strip()]
    kept: list[bytes] = []
    for raw in lines:
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if keep(value):
            kept.append(raw)
    dropped = len(lines) - len(kept)
    if dropped:
        atomic_write_bytes(path, b"".join(x + b"\n" for x in kept))
    return dropped


class RunLockBusyError(RuntimeError):
    """The folder is held by a live run.

    Attributes:
        folder: The folder.
        holder: What the lock file says about its holder (``pid``, ``host``, ``command``,
            ``started``), possibly empty.
    """

    def __init__(self, folder: str, holder: dict[str, Any]) -> None:
        self.folder = folder
        self.holder = holder
        who = holder.get("command") or "dynsched"
        pid = holder.get("pid", "?")
        host = holder.get("host")
        where = f" on {host}" if host and host != socket.gethostname() else ""
        super().__init__(f"{folder} is in use by a running {who} (pid {pid}{where})")


class RunLock:
    """An exclusive, crash-safe hold on an output folder.

    ``acquire`` takes ``fcntl.flock`` on ``<folder>/.dynsched.lock`` (without waiting)
    and writes the holder's pid, host, command and start time into it; ``release``
    empties and unlocks it. The kernel drops the lock when the holding process dies, so
    a lock file left by a crashed run is taken over (`stale` then holds what it said).

    Args:
        folder: The output folder (created if missing).
        command: What holds it, for the message of a refused run (e.g. ``"dynsched train"``).
    """

    def __init__(self, folder: str | os.PathLike[str], command: str = "dynsched") -> None:
        self.folder = os.fspath(folder)
        self.path = os.path.join(self.folder, LOCK_NAME)
        self.command = command
        self.stale: dict[str, Any] | None = None
        self._fh: IO[str] | None = None

    @staticmethod
    def _parse(text: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> RunLock:
        """Take the folder.

        Raises:
            RunLockBusyError: a live process holds it.
            OSError: the lock file cannot be created.
        """
        import fcntl

        os.makedirs(self.folder, exist_ok=True)
        fh = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = self._parse(fh.read())
            fh.close()
            raise RunLockBusyError(self.folder, holder) from None
        except BaseException:
            fh.close()
            raise
        fh.seek(0)
        previous = fh.read().strip()
        if previous:
            self.stale = self._parse(previous) or {"raw": previous[:200]}
        fh.seek(0)
        fh.truncate()
        fh.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "command": self.command,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                }
            )
        )
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        """Empty the lock file and unlock it (idempotent)."""
        fh, self._fh = self._fh, None
        if fh is None:
            return
        with contextlib.suppress(OSError):
            fh.seek(0)
            fh.truncate()
            fh.flush()
        fh.close()  # closing the last descriptor drops the flock

    @property
    def held(self) -> bool:
        """This object holds the folder."""
        return self._fh is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
