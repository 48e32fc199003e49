"""What the two commands that listen share (``serve``, ``explain --serve``): the socket, opened
before the model loads so that a busy port fails fast, and a uvicorn server that stops cleanly."""

from __future__ import annotations

import ipaddress
import socket

from attnlab.cli.common import UsageError


def graceful_server(config):
    """uvicorn's server, except that a SIGTERM or SIGINT it shut down gracefully for ends the
    process with code 0 (uvicorn raises the signal again after shutting down, which makes a
    clean stop look like a kill to a supervisor); ``stopped_by`` names the signal."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: int | None = None

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            self.stopped_by = sig
            self._captured_signals.clear()

    return Server(config)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free one), or a one-line error."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {port}")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
