"""What keeps a training run safe from the outside world: one trainer per run folder, and a
clean stop on SIGTERM / SIGINT.

* :class:`RunLock`: an OS advisory lock (``fcntl.flock``) on ``RUN/.lock``, which holds the
  owner's PID and host. A second trainer on the same folder is refused with them. The OS
  drops the lock when its process ends, however it ends, so a killed trainer never blocks the
  next one. The lock is re-entrant within a process (the demo holds its folder around the
  recipe, which takes it again). Where the file system has no locks (some FUSE mounts) the
  run goes on unlocked, with a warning; NFS without a lock daemon cannot be relied on.
* :class:`StopSignals`: SIGTERM (schedulers, ``docker stop``, ``systemd``) and SIGINT (Ctrl-C)
  only raise a flag; the trainer finishes the current optimizer step, writes a checkpoint and
  stops. In one process the first signal restores the default handlers, so a second one stops
  the process at once: the checkpoint being written is then a temporary folder, never
  published, and the previous checkpoint stays the newest complete one. Under torchrun every
  worker may get the same signal twice (from the scheduler and from torchrun, which forwards
  its own), so there repeats are ignored and the ranks wait for rank 0's checkpoint before
  they stop (torchrun gives its workers a grace period after forwarding a signal). A signal that the
  process was started to ignore (``SIG_IGN``, e.g. SIGINT of a background job) stays ignored.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import threading
import warnings
from pathlib import Path
from typing import ClassVar

from attnlab.errors import BadInput

try:
    import fcntl
except ImportError:  # Windows: no advisory locks through fcntl; runs are not locked there
    fcntl = None


class RunLock:
    """``with RunLock(run_folder):`` holds the folder for this process."""

    held: ClassVar[dict[Path, int]] = {}  # folders this process holds, and how many times

    def __init__(self, folder: str | os.PathLike):
        self.path = Path(folder).resolve() / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        if fcntl is None:
            return self
        if self.path in RunLock.held:  # this process holds it already
            RunLock.held[self.path] += 1
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise BadInput(f"{self.path.parent}: another trainer (PID {holder}) is using this "
                           "run folder; wait for it to finish or choose another --out") from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            os.close(fd)
            warnings.warn(f"{self.path.parent}: this file system has no locks; nothing stops "
                          "a second trainer on this folder", stacklevel=2)
            return self
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self.fd = fd
        RunLock.held[self.path] = 1
        return self

    def __exit__(self, *exc) -> None:
        if self.path in RunLock.held:
            RunLock.held[self.path] -= 1
            if RunLock.held[self.path]:
                return
            del RunLock.held[self.path]
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


class StopSignals:
    """``with StopSignals() as stop:`` ... ``stop.signum`` is the first SIGTERM/SIGINT seen
    (None until then). Outside the main thread signals cannot be caught: nothing changes."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, repeat_stops_at_once: bool = True):
        self.signum: int | None = None
        self.repeat_stops_at_once = repeat_stops_at_once
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        if self.repeat_stops_at_once:  # a second signal acts at once
            for s, handler in self._previous.items():
                signal.signal(s, handler)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                if signal.getsignal(s) is not signal.SIG_IGN:
                    self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""
