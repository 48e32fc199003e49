"""Throughput of ``attnlab serve`` under 1, 4, 8 and 16 concurrent clients, beside plain batched
decoding of the same model on the same steps.

The server runs in its own process (``attnlab serve``, as a user starts it); each client is a
thread of this process with the official ``openai`` client, sending greedy streamed chat
completions one after another for ``--seconds``, no two with the same prompt (a number of
its own, then one of eight requests: they share the chat template's system prompt, as a
service's requests do, which serve's prompt cache reuses). The figures: the generated tokens
of every client together (the ``usage`` each stream ends with) over the wall time, its ratio
to one client's, the time to the first token (median and 90th percentile over the requests),
and, for ``--check`` requests of each client count sent again alone afterwards, the share
whose text is unchanged (greedy: a batch must not change it; in bf16 with AVX512-BF16 a
batch's products round differently, so it may). With ``--rounds N`` the counts take turns N
times against the one server: tokens/s is the median of a count's rounds, and its ratio to
one client is taken within each round (a slow minute of the machine slows both sides of it),
then the median; the first-token times of all rounds are pooled.
Decoding reads every weight once per step whatever the batch, so batching concurrent requests
should multiply the rate.

Then, the server stopped, a worker process decodes the same chat prompts as one batch of N
rows (N = each client count) with the same pipeline ``serve`` builds (``Decoding``, the
compiled step), ``--max-tokens`` steps a row and no early stop: what the batch alone gives,
so that the server's own loss (prefill between steps, rows that end early, HTTP, the clients)
is the difference.

    .venv/bin/python benchmarks/serve.py --model smollm2 --clients 1 4 8 16 --max-tokens 64
        [--rounds 3] [--seconds 20] [--precision fp32] [--no-batch]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
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
    if args.prompt_cache is not None:
        cmd += ["--prompt-cache", str(args.prompt_cache)]
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


def message(serial: int) -> str:
    """Request ``serial``'s user message: one of :data:`PROMPTS` behind a number of its own,
    so that no two requests send the same prompt (they share the chat template's system
    prompt, as a service's requests do, and no more)."""
    return f"Request {serial}. {PROMPTS[serial % len(PROMPTS)]}"


def run_clients(url: str, clients: int, seconds: float, max_tokens: int,
                first_serial: int) -> tuple[int, float, list[float], dict[int, str], int]:
    """Each client sends streamed completions back to back until ``seconds`` have passed (the
    last one finishes); (generated tokens, wall seconds, each request's seconds to its first
    piece of text, each request's text by its serial, the next serial). Serials count from
    ``first_serial``."""
    import openai

    tokens = [0] * clients
    firsts: list[float] = []
    texts: dict[int, str] = {}
    end = time.monotonic() + seconds
    serials = iter(range(first_serial, first_serial + 10**6))
    lock = threading.Lock()

    def client(i: int) -> None:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
        while time.monotonic() < end:
            with lock:
                serial = next(serials)
            chat = [{"role": "user", "content": message(serial)}]
            sent, first, text = time.monotonic(), None, []
            for chunk in c.chat.completions.create(
                    model="m", messages=chat, max_tokens=max_tokens, temperature=0,
                    stream=True, stream_options={"include_usage": True}):
                if chunk.choices and chunk.choices[0].delta.content:
                    first = time.monotonic() - sent if first is None else first
                    text.append(chunk.choices[0].delta.content)
                if chunk.usage is not None:
                    tokens[i] += chunk.usage.completion_tokens
            if first is not None:
                firsts.append(first)
            texts[serial] = "".join(text)

    begun = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens), time.monotonic() - begun, firsts, texts, next(serials)


def as_alone(url: str, texts: dict[int, str], max_tokens: int, sample: int) -> float:
    """The share of ``sample`` of the requests (spread over the run) whose text equals the
    one their prompt gets sent again alone, one at a time (greedy: what a batch must keep; the
    server's prompt cache serves it as any request), or NaN when no request finished."""
    import openai

    c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
    serials = sorted(texts)
    picked = serials[:: max(1, len(serials) // sample)][:sample]
    same = [c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": message(k)}], max_tokens=max_tokens,
        temperature=0).choices[0].message.content == texts[k] for k in picked]
    return sum(same) / len(same) if same else float("nan")


def batch_worker(args) -> None:
    """In its own process: the same prompts as batches of each client count, decoded by the
    pipeline serve builds for ``--max-batch`` rows; prints one JSON line of tokens/s."""
    import json

    import torch

    from attnlab.generation.chat import chat_template_for
    from attnlab.generation.decode import generate
    from attnlab.generation.pipeline import Decoding, DecodingOptions
    from attnlab.storage import load

    loaded = load(args.model, int4=args.int4)
    options = DecodingOptions(precision=args.precision, bits=4 if args.int4 else None,
                              compile=args.compile, rows=max(args.clients),
                              max_new_tokens=args.max_tokens)
    decoding = Decoding(loaded, options)
    template = chat_template_for(loaded)
    rates = {}
    for n in args.clients:
        rows = [loaded.tokenizer.encode(template.render([{"role": "user", "content": message(i)}]))
                for i in range(n)]
        width = max(map(len, rows))
        pad = loaded.config.pad_id or 0
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        with torch.inference_mode():  # the first call compiles this shape
            generate(decoding.model, ids, args.max_tokens, mask, compiled=decoding.compiled)
            begun = time.perf_counter()
            generate(decoding.model, ids, args.max_tokens, mask, compiled=decoding.compiled)
        rates[n] = n * args.max_tokens / (time.perf_counter() - begun)
    print(json.dumps(rates))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seconds", type=float, default=30.0,
                   help="how long each client count runs (requests in flight then finish)")
    p.add_argument("--precision", default="auto")
    p.add_argument("--int4", action="store_true")
    p.add_argument("--verbose", action="store_true", help="the server's log on stderr")
    p.add_argument("--check", type=int, default=8,
                   help="requests of each client count sent again alone to compare texts")
    p.add_argument("--prompt-cache", type=float, default=None, metavar="MB",
                   help="serve's --prompt-cache (default: serve's own)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="serve's compiled step (its default; the compile falls in the warm-up)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the client counts in turn this many times against one server: "
                        "tokens/s is each count's median, its ratio the median of each round's "
                        "ratio to the first count's rate in that round (this VM's speed moves "
                        "from minute to minute)")
    p.add_argument("--batch-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-batch", action="store_true",
                   help="skip plain batched decoding after the server")
    args = p.parse_args()
    if args.rounds < 1 or len(set(args.clients)) < len(args.clients) or min(args.clients) < 1:
        p.error("--rounds must be >= 1, and --clients distinct counts >= 1")
    if args.batch_worker:
        return batch_worker(args)
    import torch

    from attnlab import hardware

    model, flags = hardware.cpu_flags()
    print(f"machine: {model} ({hardware.isa_summary(flags)}), {os.cpu_count()} CPUs, torch "
          f"{torch.__version__}, Python {platform.python_version()}")
    proc, url = start_server(args)
    try:
        run_clients(url, 1, 0.1, 8, 10**7)  # warm up: the first forward allocates
        # each count's rounds: (tokens/s, first-token times, texts)
        runs: dict[int, list] = {n: [] for n in args.clients}
        serial = 0
        for r in range(args.rounds):
            for n in args.clients:
                tokens, wall, firsts, texts, serial = run_clients(url, n, args.seconds,
                                                                  args.max_tokens, serial)
                runs[n].append((tokens / wall, firsts, texts))
                print(f"{'' if args.rounds == 1 else f'round {r + 1}: '}{n} clients: "
                      f"{tokens} tokens in {wall:.1f} s", flush=True)
        rows = []
        for n in args.clients:
            rates = [rate for rate, _, _ in runs[n]]
            # against one client's rate in the same round, then the median over the rounds
            ratio = statistics.median(rate / one for rate, (one, _, _)
                                      in zip(rates, runs[args.clients[0]], strict=True))
            firsts = [t for _, times, _ in runs[n] for t in times]
            texts = {k: v for _, _, run in runs[n] for k, v in run.items()}
            # the checks come after every count: they do not share its time
            rows.append([n, statistics.median(rates), ratio, statistics.median(firsts),
                         statistics.quantiles(firsts, n=10)[-1] if len(firsts) > 1
                         else firsts[0], as_alone(url, texts, args.max_tokens, args.check),
                         rates])
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    batched = {}
    if not args.no_batch:
        worker = subprocess.run([sys.executable, __file__, "--batch-worker", *sys.argv[1:]],
                                capture_output=True, text=True, timeout=1800)
        if worker.returncode:
            sys.exit(f"the batch worker failed:\n{worker.stderr}")
        batched = {int(k): v for k, v in json.loads(worker.stdout.splitlines()[-1]).items()}
    cache = "" if args.prompt_cache is None else f" --prompt-cache {args.prompt_cache:g}"
    print(f"\nattnlab serve --model {args.model} --precision {args.precision}"
          f"{' --int4' if args.int4 else ''}{'' if args.compile else ' --no-compile'}{cache}, "
          "greedy streamed chat completions of up to "
          f"{args.max_tokens} tokens, {torch.get_num_threads()} threads; batched: the same "
          f"pipeline, one batch of N prompts, {args.max_tokens} steps\n")
    print("| clients | tokens/s | vs 1 client | first token, median / p90 (s) | texts as alone "
          "| batched N tokens/s | vs batched 1 | serve / batched |")
    print("|---|---|---|---|---|---|---|---|")
    for n, rate, ratio, median, p90, same, _ in rows:
        b = batched.get(n)
        extra = (f"{b:.1f} | {b / batched[args.clients[0]]:.2f}x | {rate / b:.2f}"
                 if b else "– | – | –")
        print(f"| {n} | {rate:.1f} | {ratio:.2f}x | {median:.2f} / {p90:.2f} | "
              f"{same:.0%} | {extra} |")
    if args.rounds > 1:
        print(f"\nEach round's tokens/s (its ratio to the same round's {args.clients[0]} "
              "client(s)):\n")
        print("| clients | " + " | ".join(f"round {r + 1}" for r in range(args.rounds)) + " |")
        print("|---|" + "---|" * args.rounds)
        for n, *_, rates in rows:
            print(f"| {n} | " + " | ".join(
                f"{rate:.1f} ({rate / one:.2f}x)" for rate, one in zip(rates, rows[0][-1],
                                                                       strict=True)) + " |")

if __name__ == "__main__":
    main()
