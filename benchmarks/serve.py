"""Throughput of ``attnlab serve`` under 1, 4 and 8 concurrent clients (#21 item 4).

The server runs in its own process (``attnlab serve``, as a user starts it); each client is a
thread of this process with the official ``openai`` client, sending greedy completions one
after another for ``--seconds``. The figure is the generated tokens of every client together
(the ``usage`` of each response) over the wall time, and its ratio to one client's: decoding
reads every weight once per step whatever the batch, so batching concurrent requests should
multiply it.

    .venv/bin/python benchmarks/serve.py --model smollm2 --clients 1 4 8 --max-tokens 64
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a transformer language model generates text, step by step.",
    "List ten things to pack for a week of hiking in the mountains, with reasons.",
    "Describe the water cycle to a ten-year-old.",
    "What are the pros and cons of working from home? Answer at length.",
    "Write a recipe for a vegetable soup, with every step.",
    "Tell me about the history of the printing press.",
    "Compose a letter to a friend you have not seen in years.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [str(ROOT / ".venv" / "bin" / "attnlab"), "serve", "--model", args.model,
           "--name", "m", "--port", str(port), "--max-batch", str(max(args.clients)),
           "--precision", args.precision] + ([] if args.verbose else ["--quiet"])
    if args.int4:
        cmd.append("--int4")
    cmd.append("--compile" if args.compile else "--no-compile")
    proc = subprocess.Popen(cmd, stderr=None if args.verbose else subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    import urllib.request

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited: {proc.stderr.read()}")
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit("the server did not start within 300 s")


def run_clients(url: str, clients: int, seconds: float, max_tokens: int) -> tuple[int, float]:
    """Each client sends completions back to back until ``seconds`` have passed (the last one
    finishes); (generated tokens, wall seconds)."""
    import openai

    tokens = [0] * clients
    end = time.monotonic() + seconds

    def client(i: int) -> None:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
        k = i
        while time.monotonic() < end:
            chat = [{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}]
            r = c.chat.completions.create(model="m", messages=chat, max_tokens=max_tokens,
                                          temperature=0)
            tokens[i] += r.usage.completion_tokens
            k += clients

    begun = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens), time.monotonic() - begun


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seconds", type=float, default=30.0,
                   help="how long each client count runs (requests in flight then finish)")
    p.add_argument("--precision", default="auto")
    p.add_argument("--int4", action="store_true")
    p.add_argument("--verbose", action="store_true", help="the server's log on stderr")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="serve's compiled step (its default; the compile falls in the warm-up)")
    args = p.parse_args()
    import torch

    from attnlab import hardware

    model, flags = hardware.cpu_flags()
    print(f"machine: {model} ({hardware.isa_summary(flags)}), {os.cpu_count()} CPUs, torch "
          f"{torch.__version__}, Python {platform.python_version()}")
    proc, url = start_server(args)
    try:
        run_clients(url, 1, 0.1, 8)  # warm up: the first forward allocates (and compiles)
        rows = []
        for n in args.clients:
            tokens, wall = run_clients(url, n, args.seconds, args.max_tokens)
            rows.append((n, tokens, wall, tokens / wall))
            print(f"{n} clients: {tokens} tokens in {wall:.1f} s", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    base = rows[0][3]
    print(f"\nattnlab serve --model {args.model} --precision {args.precision}"
          f"{' --int4' if args.int4 else ''}{'' if args.compile else ' --no-compile'}, "
          "greedy chat completions of up to "
          f"{args.max_tokens} tokens, {torch.get_num_threads()} threads\n")
    print("| clients | tokens | seconds | tokens/s | vs 1 client |")
    print("|---|---|---|---|---|")
    for n, tokens, wall, rate in rows:
        print(f"| {n} | {tokens} | {wall:.1f} | {rate:.1f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
