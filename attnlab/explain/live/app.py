"""The live explainer's web app (FastAPI): the page, its script and style from the package, and
the JSON API the page calls (``session.py`` does the model's work).

    GET  /                      the page          GET /static/NAME: its scripts and style
    GET  /api/info              the model: its kind, device, precision, limits, an example
    POST /api/run               a run: tokens, attention, stages and checks, the output logits,
                                heads switched off (``ablate``), patching (``patch_from``)
    GET  /api/attention         another layer of a run's attention
    GET  /api/stage             a stage's values         GET /api/lens   a run's logit lens
    POST /api/next              the next token, drawn by attnlab's generator
    POST /api/html              the self-contained page ``explain --html`` writes

The model runs one request at a time (a lock: the others wait their turn). Request bodies are
untrusted: their size is bounded before they are read, every field is checked for its type,
and bad input is a 4xx with ``{"error": "one line"}``: 400 a malformed body, 401 a missing or
wrong key, 404 a run that is no longer kept, 413 too long, 422 input the model cannot take.
With an API key, every ``/api/`` request must send ``Authorization: Bearer KEY``; the page and
its files are served to anyone who can reach the port (they hold no data).
"""

from __future__ import annotations

import hmac
import json
import sys
import threading
import time
import traceback
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse

from attnlab.errors import BadInput
from attnlab.explain.live.session import Ask, RunGone, Session, TooLong

STATIC = Path(__file__).parent / "static"
FILES = {"helpers.js": "text/javascript", "attention.js": "text/javascript",
         "output.js": "text/javascript", "live.js": "text/javascript", "live.css": "text/css"}
MAX_BODY = 1 << 20  # bytes: a drawn image is a few hundred numbers, a sentence a few hundred
MAX_WAITING = 16  # model requests queued behind the one running; more get a 503
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


class Refused(Exception):
    """A request answered with ``status`` and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def create_app(session: Session, api_key: str | None = None,
               local_only: bool = False) -> FastAPI:
    """The app serving ``session``; with ``api_key``, ``/api/`` requests must prove it. With
    ``local_only`` (a server on a loopback address), a request must name a loopback host:
    another site's page, which the browser lets post to 127.0.0.1, or that rebinds its own
    name to it, is turned away."""
    app = FastAPI(title="attnlab explain", docs_url=None, redoc_url=None, openapi_url=None)
    lock, gate = threading.Lock(), threading.Lock()  # the model's turn; the queue's count
    waiting = [0]

    def work(fn, *args) -> JSONResponse:
        """``fn(*args)`` on the model, one request at a time, its errors as 4xx lines."""
        with gate:
            if waiting[0] >= MAX_WAITING:
                raise Refused(503, f"{MAX_WAITING} requests are already waiting: try again soon")
            waiting[0] += 1
        began = time.perf_counter()
        try:
            with lock:
                with gate:
                    waiting[0] -= 1
                data = fn(*args)
        except BadInput as e:  # the walk's messages name the CLI's flags: "--head 9: …"
            status = 404 if isinstance(e, RunGone) else 413 if isinstance(e, TooLong) else 422
            raise Refused(status, str(e).removeprefix("--")) from None
        data["server_ms"] = round((time.perf_counter() - began) * 1000, 1)
        return JSONResponse(data)

    @app.middleware("http")
    async def key(request: Request, call_next):
        host = request.headers.get("host", "").rsplit(":", 1)[0] if local_only else None
        if host is not None and host not in LOOPBACK:
            return JSONResponse({"error": f"this server answers requests for 127.0.0.1, not "
                                          f"{host!r}"}, status_code=403)
        if request.url.path.startswith("/api/") and api_key is not None:
            sent = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(sent, f"Bearer {api_key}".encode()):
                return JSONResponse({"error": "a missing or wrong API key: the page asks for "
                                              "it once"}, status_code=401)
        return await call_next(request)

    @app.exception_handler(Refused)
    async def refused(request: Request, e: Refused) -> JSONResponse:
        return JSONResponse({"error": str(e)}, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "body"))
        return JSONResponse({"error": f"{where}: {first.get('msg', 'malformed')}"},
                            status_code=400)

    @app.exception_handler(Exception)
    async def bug(request: Request, e: Exception) -> JSONResponse:
        traceback.print_exc(file=sys.stderr)  # the server keeps serving; the trace is logged
        return JSONResponse({"error": f"internal error ({type(e).__name__}): {e}"},
                            status_code=500)

    @app.get("/")
    async def page() -> FileResponse:
        return FileResponse(STATIC / "page.html", media_type="text/html")

    @app.get("/static/{name}")
    async def static(name: str) -> FileResponse:
        if name not in FILES:
            raise Refused(404, f"no file {name!r}")
        return FileResponse(STATIC / name, media_type=FILES[name])

    @app.get("/api/info")
    async def info() -> JSONResponse:
        return JSONResponse(session.info())

    @app.post("/api/run")
    async def run(request: Request) -> JSONResponse:
        ask = _ask(await _body(request))
        return await _off_loop(work, session.run, ask)

    @app.post("/api/next")
    async def next_token(request: Request) -> JSONResponse:
        body = await _body(request)
        sampling = {name: body.pop(name, None) for name in ("temperature", "top_k", "top_p",
                                                            "seed")}
        temperature = _real(sampling, "temperature", 0.0)
        top_k, seed = (_field(sampling, n, int, None) for n in ("top_k", "seed"))
        top_p = _real(sampling, "top_p", None)
        if seed is not None and not 0 <= seed < 2 ** 63:
            raise Refused(422, f"the seed must be in [0, 2^63), got {seed}")
        return await _off_loop(work, session.next, _ask(body), temperature, top_k, top_p,
                               seed)

    @app.post("/api/html")
    async def html(request: Request) -> JSONResponse:
        ask = _ask(await _body(request))
        return await _off_loop(work, lambda a: {"html": session.html(a)}, ask)

    @app.get("/api/attention")
    def attention(run: str, view: str, layer: int) -> JSONResponse:
        return work(session.attention, run, view, layer)

    @app.get("/api/stage")
    def stage(run: str, i: int) -> JSONResponse:
        return work(session.stage, run, i)

    @app.get("/api/lens")
    def lens(run: str) -> JSONResponse:
        return work(session.lens, run)

    return app


async def _off_loop(fn, *args):
    """Run ``fn`` on a worker thread: the event loop keeps answering while the model works."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


async def _body(request: Request) -> dict:
    """The request's JSON object, its size bounded before it is read. Only a JSON request is
    read: a page on another site can post plain text to 127.0.0.1 without asking, but not
    JSON (the browser asks the server first, and this one does not answer yes)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise Refused(415, "send the body as JSON (Content-Type: application/json)")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        raise Refused(413, f"the request is larger than {MAX_BODY} bytes")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise Refused(413, f"the request is larger than {MAX_BODY} bytes")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        raise Refused(400, "the request body is not JSON, or nests too deeply") from None
    if not isinstance(body, dict):
        raise Refused(400, "the request body must be a JSON object")
    return body


def _field(body: dict, name: str, kind, default):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise Refused(400, f"{name!r} must be {names.replace('str', 'a string')}, got "
                           f"{type(value).__name__}")
    return value


def _real(body: dict, name: str, default: float | None) -> float | None:
    """A number field as a float (a JSON integer too large for one is refused)."""
    value = _field(body, name, (int, float), default)
    try:
        return None if value is None else float(value)
    except OverflowError:
        raise Refused(422, f"{name!r} is too large") from None


def _ask(body: dict) -> Ask:
    """The page's input, each field checked for its type (their values are the session's)."""
    known = {"sentence", "target", "digit", "image", "layer", "head", "ablate", "patch_from"}
    extra = sorted(set(body) - known)
    if extra:
        raise Refused(400, f"unknown field {extra[0]!r}; the fields are {', '.join(sorted(known))}")
    ablate = _field(body, "ablate", list, [])
    if not all(isinstance(h, str) for h in ablate):
        raise Refused(400, "'ablate' must be a list of heads as strings, e.g. [\"0.1\"]")
    return Ask(sentence=_field(body, "sentence", str, ""), target=_field(body, "target", str, None),
               digit=_field(body, "digit", int, None), image=_field(body, "image", list, None),
               layer=_field(body, "layer", int, 0), head=_field(body, "head", int, 0),
               ablate=ablate, patch_from=_field(body, "patch_from", str, None))


__all__ = ["create_app", "MAX_BODY"]
