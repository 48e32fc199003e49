"""The HTTP application of ``attnlab serve``: OpenAI's endpoints on FastAPI.

    GET  /health                 {"status": "ok"}
    GET  /v1/models              the one model this server runs
    POST /v1/completions         a prompt continued       (decoder-only models)
    POST /v1/chat/completions    a conversation answered  (decoder-only models with a template)
    POST /v1/embeddings          sentence vectors          (encoder models)

Completions and chats go to one :class:`~attnlab.serving.engine.Engine`, which decodes every
request in flight in one batch. A streamed response sends each piece of text as soon as it is
safe (:class:`~attnlab.generation.pipeline.TextStream`) in OpenAI's server-sent chunks, then
``data: [DONE]``. A client that goes away, a stop string and the per-request time limit end
the request's row in the engine at its next step.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnlab.errors import BadInput
from attnlab.generation.chat import stop_token_ids
from attnlab.generation.pipeline import TextStream
from attnlab.serving import protocol as api
from attnlab.serving.engine import Engine
from attnlab.serving.engine import Request as EngineRequest

MAX_INPUTS = 2048  # texts one embeddings request may send


@dataclass
class Service:
    """What the application serves: the model's name (as /v1/models lists it), its tokenizer,
    and either the decoding ``engine`` (decoders; ``template`` for chat) or the ``encoder``
    (a :class:`~attnlab.sentence_encoder.SentenceEncoder`, for embeddings)."""

    name: str
    tokenizer: Any
    context: int
    engine: Engine | None = None
    template: Any = None  # attnlab.generation.chat.ChatTemplate
    encoder: Any = None
    token_limit: int = 4096  # new tokens a request may ask for
    request_timeout: float = 600.0  # seconds a request may decode
    log: Callable[[str], None] = print
    timing: Callable[..., str] | None = None  # (load_s, compile_s, prompt, begun, ticks) -> line
    created: int = field(default_factory=lambda: int(time.time()))
    _encode_lock: threading.Lock = field(default_factory=threading.Lock)
    # the engine's events for the running event loop
    _mailbox: _Mailbox | None = field(default=None, init=False, repr=False, compare=False)

    def mailbox(self, loop: asyncio.AbstractEventLoop) -> _Mailbox:
        mailbox = self._mailbox  # (another loop's thread may replace it meanwhile)
        if mailbox is None or mailbox.loop is not loop:
            mailbox = self._mailbox = _Mailbox(loop)
        return mailbox


class _Mailbox:
    """The engine's events on their way to the event loop: the engine's thread posts each
    row's new tokens, and one wake-up of the loop delivers everything posted since the last
    (a wake-up writes to the loop's pipe, a system call on the engine's thread: one for every
    row of every step was a share of the step)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue, Any]] = []

    def post(self, queue: asyncio.Queue, item: Any) -> None:
        with self._lock:
            self._items.append((queue, item))
            if len(self._items) > 1:
                return  # the first one's wake-up, not yet delivered, takes this one too
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed: nothing will take them
            with self._lock:
                self._items.clear()
            raise

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for queue, item in items:
            queue.put_nowait(item)


class _ApiKey:
    """Every HTTP request must send ``Authorization: Bearer <key>`` (401 otherwise). A plain
    ASGI middleware: Starlette's ``BaseHTTPMiddleware`` would wrap the request's messages so
    that a route no longer sees its client disconnect."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            sent = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(sent, self.expected):
                error = api.ApiError(401, "a missing or wrong API key: send the header "
                                          "'Authorization: Bearer <key>'", code="invalid_api_key")
                await JSONResponse(error.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(service: Service, api_key: str | None = None) -> FastAPI:
    """The FastAPI application serving ``service``; with ``api_key``, every request must send
    ``Authorization: Bearer <api_key>`` (401 otherwise)."""

    async def lifespan(app: FastAPI):
        yield
        if service.engine is not None:  # in-flight requests had uvicorn's grace period
            await asyncio.to_thread(service.engine.stop)

    app = FastAPI(title="attnlab", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    if api_key is not None:
        app.add_middleware(_ApiKey, key=api_key)

    @app.exception_handler(api.ApiError)
    async def api_error(request: Request, error: api.ApiError):
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        message = f"{request.method} {request.url.path}: {error.detail}"
        return JSONResponse(api.ApiError(error.status_code, message).body(),
                            status_code=error.status_code)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": service.name,
                "busy": 0 if service.engine is None else service.engine.busy}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.name, "object": "model",
                                            "created": service.created, "owned_by": "attnlab"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _body(request)
        api.check_model(body, service.name)
        prompts = _prompts(body.get("prompt"), service.tokenizer)
        sampling = api.Sampling.from_body(body, 16, service.token_limit)
        return await _complete(request, service, prompts, sampling, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _body(request)
        api.check_model(body, service.name)
        if service.template is None:
            raise api.ApiError(400, f"'{service.name}' has no chat template (start the server "
                                    "with --chat-template FILE); use /v1/completions")
        from attnlab.generation.chat import check_messages

        try:
            text = service.template.render(check_messages(body.get("messages")),
                                           add_generation_prompt=True)
        except BadInput as e:
            raise api.ApiError(400, str(e), param="messages") from None
        ids = service.tokenizer.encode(text)
        sampling = api.Sampling.from_body(body, None, service.token_limit)
        sampling.stop = sampling.stop + [s for s in service.template.stop_strings
                                         if s not in sampling.stop]
        return await _complete(request, service, [ids], sampling, chat=True)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        body = await _body(request)
        api.check_model(body, service.name)
        return await _embed(service, body)

    return app


async def _body(request: Request) -> dict:
    """The request's JSON object, its size checked before and while it is read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > api.MAX_BODY:
        raise api.too_large(int(declared))
    return api.parse_body(await api.read_body(request.stream()))


def _prompts(prompt, tokenizer) -> list[list[int]]:
    """``prompt``: a string, a list of strings, a list of token ids or a list of such lists;
    each as token ids."""
    if isinstance(prompt, str):
        prompt = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or len(prompt) > api.MAX_N:
        raise api.ApiError(400, f"'prompt' must be a string or a list of 1 to {api.MAX_N} "
                                "strings or token lists", param="prompt")
    out = []
    for p in prompt:
        if isinstance(p, str):
            ids = tokenizer.encode(p)
        elif (isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                          and 0 <= t < tokenizer.vocab_size for t in p)):
            ids = list(p)
        else:
            raise api.ApiError(400, "'prompt' lists must hold strings, or token ids in "
                                    f"[0, {tokenizer.vocab_size})", param="prompt")
        if not ids:
            if tokenizer.bos_id is None:
                raise api.ApiError(400, "'prompt' is empty and the model has no beginning-of-"
                                        "sequence token to start from", param="prompt")
            ids = [tokenizer.bos_id]
        out.append(ids)
    return out


def _compile_seconds(service: Service) -> float:
    """The engine's compile time so far (0 without a compiled step)."""
    compiled = getattr(service.engine, "compiled", None)
    return 0.0 if compiled is None else compiled.compile_seconds


async def _complete(request: Request, service: Service, prompts: list[list[int]],
                    sampling: api.Sampling, chat: bool) -> Response:
    """Run ``sampling.n`` choices of every prompt through the engine; one JSON response, or a
    stream of chunks."""
    if service.engine is None:
        raise api.ApiError(400, f"'{service.name}' is an encoder model: it serves "
                                "/v1/embeddings only")
    if len(prompts) * sampling.n > api.MAX_N:
        raise api.ApiError(400, f"{len(prompts)} prompts x n={sampling.n} choices exceed "
                                f"{api.MAX_N}", param="n")
    longest = max(len(p) for p in prompts)
    room = service.context - longest
    max_tokens = sampling.max_tokens if sampling.max_tokens is not None else min(
        room, service.token_limit)
    if longest + max_tokens > service.context or max_tokens < 1:
        raise api.too_long(longest, max(max_tokens, 1), service.context,
                           "messages" if chat else "prompt")
    mailbox = service.mailbox(asyncio.get_running_loop())
    events: asyncio.Queue = asyncio.Queue()
    tok = service.tokenizer
    decode = tok.decode
    # the end token, and a stop string that is one special token (a chat template's end of
    # turn, <|eot_id|>): decoded text skips special tokens, so those stop by their id
    eos = tuple(sorted(stop_token_ids(tok, sampling.stop)))
    deadline = time.monotonic() + service.request_timeout
    streams, handles, prompt_of = [], [], []
    begun, ticks = time.perf_counter(), []
    compiled_before = _compile_seconds(service)
    for p, ids in enumerate(prompts):
        for j in range(sampling.n):
            i = len(handles)

            def on_tokens(new, finish, i=i):
                mailbox.post(events, (i, new, finish))

            seed = None if sampling.seed is None else sampling.seed + j
            try:
                handles.append(service.engine.submit(EngineRequest(
                    ids, max_tokens, on_tokens, sampling.temperature, sampling.top_p,
                    sampling.top_k, seed, eos, deadline)))
            except BadInput as e:  # the engine is shutting down
                for h in handles:
                    h.cancel()
                raise api.ApiError(503, str(e), kind="server_error") from None
            streams.append(TextStream(decode, sampling.stop))
            prompt_of.append(p)
    rid = api.new_id("chatcmpl" if chat else "cmpl")
    finishes: list[str | None] = [None] * len(handles)
    counts = [0] * len(handles)
    prompt_tokens = sum(len(p) for p in prompts)

    def take(event) -> tuple[int, str, str | None] | None:
        """An engine event as (choice, text to send, finish), None if its choice had ended."""
        i, new, finish = event
        if finishes[i] is not None:
            return None  # a choice already ended by a stop string
        counts[i] += len(new)
        if i == 0 and new:
            ticks.append(time.perf_counter())
        piece = streams[i].feed(new, final=finish is not None)
        if finish is None and streams[i].stopped:
            handles[i].cancel()
            finish = "stop"
        if finish == "error":
            raise api.ApiError(500, "decoding failed; the server's log has the traceback",
                               kind="server_error")
        if finish is not None:
            finish = {"cancelled": "length"}.get(finish, finish)  # shut down: cut short
            finishes[i] = finish
        return i, piece, finish

    def done(status: int) -> None:
        for h in handles:
            h.cancel()
        line = f"{request.method} {request.url.path} {status} {rid}"
        if service.timing is not None:
            compile_s = _compile_seconds(service) - compiled_before  # while it ran
            line += " " + service.timing(0.0, compile_s, len(prompts[0]), begun, ticks)
        service.log(line)

    if not sampling.stream:
        try:
            looked = time.monotonic()
            while None in finishes:
                try:
                    take(await asyncio.wait_for(events.get(), timeout=0.5))
                except asyncio.TimeoutError:
                    pass
                # is the client still there? every half second, whether tokens come or not
                if time.monotonic() - looked >= 0.5:
                    looked = time.monotonic()
                    if await request.is_disconnected():
                        done(499)
                        return Response(status_code=499)
        except api.ApiError:
            done(500)
            raise
        done(200)
        return JSONResponse(api.completion(rid, service.name, [s.text for s in streams],
                                           finishes, prompt_tokens, sum(counts), chat))

    async def stream():
        status = 200
        try:
            if chat:
                for i in range(len(handles)):
                    yield api.sse(api.chunk(rid, service.name, i, None, None, True, role=True))
            while None in finishes:
                taken = take(await events.get())
                if taken is not None and (taken[1] or taken[2]):
                    yield api.sse(api.chunk(rid, service.name, *taken, chat))
            if sampling.include_usage:
                last = api.chunk(rid, service.name, 0, None, None, chat)
                last.update(choices=[], usage=api.usage(prompt_tokens, sum(counts)))
                yield api.sse(last)
            yield api.sse("[DONE]")
        except api.ApiError as e:
            status = e.status
            yield api.sse(e.body())
        except asyncio.CancelledError:  # the client went away
            status = 499
            raise
        finally:
            done(status)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _embed(service: Service, body: dict) -> JSONResponse:
    """``/v1/embeddings``: each input's mean-pooled, L2-normalised sentence vector."""
    enc = service.encoder
    if enc is None:
        raise api.ApiError(400, f"'{service.name}' is a decoder model: embeddings need an "
                                "encoder (e.g. --model minilm)")
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if (not isinstance(texts, list) or not 1 <= len(texts) <= MAX_INPUTS
            or not all(isinstance(t, str) and t for t in texts)):
        raise api.ApiError(400, f"'input' must be a non-empty string or a list of 1 to "
                                f"{MAX_INPUTS} of them (token arrays are not accepted)",
                           param="input")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise api.ApiError(400, "'encoding_format' must be 'float' or 'base64'",
                           param="encoding_format")
    if body.get("dimensions") is not None:
        raise api.ApiError(400, "'dimensions' is not supported: the vectors have the "
                                f"model's {enc.model.config.d_model}", param="dimensions")
    lengths = [len(enc.tokenizer.encode_single(t)) for t in texts]
    for i, n in enumerate(lengths):
        if n > enc.max_len:
            raise api.ApiError(400, f"input {i} has {n} tokens; this model reads at most "
                                    f"{enc.max_len}", param="input",
                               code="context_length_exceeded")

    def run() -> torch.Tensor:
        from attnlab.sentence_encoder import embed_sentences

        with service._encode_lock, torch.inference_mode():
            return embed_sentences(enc, texts).float().cpu()

    vectors = await asyncio.to_thread(run)
    data = []
    for i, v in enumerate(vectors):
        if fmt == "base64":  # little-endian float32, as OpenAI's client decodes it
            value: Any = base64.b64encode(v.numpy().astype("<f4").tobytes()).decode()
        else:
            value = v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return JSONResponse({"object": "list", "data": data, "model": service.name,
                         "usage": {"prompt_tokens": sum(lengths),
                                   "total_tokens": sum(lengths)}})
