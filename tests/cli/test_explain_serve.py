"""``attnlab explain --serve``: the command starts the live page's server and says where to open
it; what the page would do is refused with the command's other modes, and an address other
machines can reach needs a key. (The page itself: tests/explain/live/.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.cli.helpers import assert_bad_input, cli


@pytest.mark.parametrize("argv, names", [
    (["--serve", "--lens"], ["--serve", "--lens"]),
    (["--serve", "--html", "x.html"], ["--html"]),
    (["--serve", "--backward"], ["--backward"]),
    (["--serve", "--max-tokens", "0"], ["--max-tokens"]),
    (["--serve", "--host", "0.0.0.0"], ["--host 0.0.0.0", "--api-key"]),
    (["--serve", "--port", "70000"], ["--port"]),
    (["--serve", "--layer", "1"], ["--layer"]),
    (["--serve", "--temperature", "0.5"], ["--temperature"]),
    (["--serve", "--examples"], ["--examples"]),
    (["the cat", "--port", "9000"], ["--port", "--serve"]),
    (["the cat", "--api-key", "k"], ["--api-key", "--serve"]),
])
def test_serve_refuses_what_it_cannot_do(capsys, monkeypatch, argv, names):
    monkeypatch.delenv("ATTNLAB_API_KEY", raising=False)
    assert_bad_input(cli(capsys, "explain", *argv), *names)


def test_serve_starts_the_page_and_stops_cleanly(tmp_path):
    """A real process on a free port: the line with the address, the page, the API (the first
    sentence given on the command line), then SIGTERM ends it with code 0."""
    server = subprocess.Popen(
        [sys.executable, "-m", "attnlab.cli", "explain", "--serve", "--port", "0", "--seed",
         "3", "the cat sat on the mat"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        line = ""
        while "open http" not in line:
            assert time.monotonic() < deadline and server.poll() is None, server.stderr.read()
            line = server.stdout.readline()
        url = line.split("open ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/")
        with urllib.request.urlopen(url, timeout=30) as page:
            assert b"/static/live.js" in page.read()
        with urllib.request.urlopen(url + "api/info", timeout=30) as reply:
            info = json.loads(reply.read())
        assert info["example"] == "the cat sat on the mat" and info["kind"] == "seq2seq"
        assert "random" in info["model"]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(
                url + "api/run", b'{"sentence": ""}', {"Content-Type": "application/json"}),
                timeout=30)
        assert e.value.code == 422
    finally:
        server.terminate()
        code = server.wait(timeout=30)
    assert code == 0
    assert "Traceback" not in server.stderr.read()
