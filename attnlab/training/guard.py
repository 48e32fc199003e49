"""What keeps a training run safe from the outside world: one trainer per run folder, and a
clean stop on SIGTERM / SIGINT.

* :class:`RunLock`: an OS advisory lock (``fcntl.flock``) on ``RUN/.lock``, which holds the
  owner's PID. A second trainer on the same folder is refused with that PID. The OS drops the
  lock when its process ends, however it ends, so a killed trainer never blocks the next one.
* :class:`StopSignals`: SIGTERM (schedulers, ``docker stop``, ``systemd``) and SIGINT (Ctrl-C)
  only raise a flag; the trainer finishes the current optimizer step, writes a checkpoint and
  stops. The first signal restores the default handlers, so a second one stops the process
  at once: the checkpoint being written is then a temporary folder, never published, and the
  previous checkpoint stays the newest complete one.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from attnlab.errors import BadInput

try:
    import fcntl
except ImportError:  # Windows: no advisory locks through fcntl; runs are not locked there
    fcntl = None


class RunLock:
    """``with RunLock(run_folder):`` holds the folder for this process."""

    def __init__(self, folder: str | os.PathLike):
        self.path = Path(folder) / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        if fcntl is None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise BadInput(f"{self.path.parent}: another trainer (PID {holder}) is using this "
                           "run folder; wait for it to finish or choose another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


class StopSignals:
    """``with StopSignals() as stop:`` ... ``stop.signum`` is the first SIGTERM/SIGINT seen
    (None until then). Outside the main thread signals cannot be caught: nothing changes."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        for s, handler in self._previous.items():  # a second signal acts at once
            signal.signal(s, handler)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""
