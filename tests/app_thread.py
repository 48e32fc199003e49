"""An ASGI app served by uvicorn on a thread, on 127.0.0.1 and a free port: what the server
tests (``serve``'s OpenAI API, ``explain --serve``'s page) talk to, stopped by ``close()``."""

from __future__ import annotations

import socket
import threading
import time


class AppThread:
    """``app`` served on a daemon thread; ``url`` ends without a slash."""

    def __init__(self, app, start_within: float = 20.0) -> None:
        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_within
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
