"""OpenAI's HTTP API as attnlab speaks it: requests checked field by field, responses and
stream chunks in OpenAI's shapes (the text itself comes from
:class:`~attnlab.generation.pipeline.TextStream`).

A request body is untrusted input: its size is bounded before it is parsed, every field is
checked for its type and range, and a problem becomes an OpenAI error object
``{"error": {"message", "type", "param", "code"}}`` with the HTTP status OpenAI uses (400 for
a bad request, 404 for an unknown model), never a traceback.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

MAX_BODY = 1 << 20  # bytes of JSON a request may send (a long prompt is ~100 KB)
MAX_N = 8  # choices a request may ask for
MAX_STOPS = 4  # stop strings, as OpenAI allows
MAX_STOP_CHARS = 256  # each; a stop string is looked for at every token


class ApiError(Exception):
    """An error the client caused (or may retry), sent as OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (status, message, param,
                                                                       code, kind)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


def too_large(size: int | str) -> ApiError:
    return ApiError(413, f"the request body of {size} bytes exceeds the limit of {MAX_BODY} "
                         "bytes", code="request_too_large")


async def read_body(chunks) -> bytes:
    """The body from ``chunks`` (Starlette's ``request.stream()``), read no further than
    :data:`MAX_BODY` + 1 bytes: a 413 :class:`ApiError` past it, whatever Content-Length
    said (the caller refuses a declared length over the limit before reading)."""
    parts, size = [], 0
    async for part in chunks:
        size += len(part)
        if size > MAX_BODY:
            raise too_large(f"more than {MAX_BODY}")
        parts.append(part)
    return b"".join(parts)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, or a 400/413 :class:`ApiError`."""
    if len(raw) > MAX_BODY:
        raise too_large(len(raw))
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # (JSONDecodeError is one)
        # RecursionError: nesting deeper than the parser's stack; ValueError also covers an
        # integer of more than 4,300 digits
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise ApiError(400, f"the request body is not valid JSON ({reason})",
                       code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def _number(body: dict, name: str, default, low: float, high: float, integer: bool = False):
    value = body.get(name)
    if value is None:
        return default
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
        what = "an integer" if integer else "a number"
        raise ApiError(400, f"'{name}' must be {what} in [{low}, {high}], got {value!r}",
                       param=name)
    return value


@dataclass
class Sampling:
    """The decoding settings of a completion or chat request, checked."""

    max_tokens: int | None
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False

    @classmethod
    def from_body(cls, body: dict, default_max_tokens: int | None, token_limit: int) -> Sampling:
        """``default_max_tokens``: OpenAI's default (16 for completions; None = what the
        context leaves, for chat); ``token_limit``: the server's cap on new tokens."""
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        if max_tokens is not None:
            max_tokens = _number(body, name, None, 1, token_limit, integer=True)
        elif default_max_tokens is not None:
            max_tokens = min(default_max_tokens, token_limit)
        stop = body.get("stop")
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        if (not isinstance(stop, list) or len(stop) > MAX_STOPS
                or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop)):
            raise ApiError(400, f"'stop' must be a string of 1 to {MAX_STOP_CHARS} characters "
                                f"or a list of at most {MAX_STOPS} of them", param="stop")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "'stream' must be true or false", param="stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise ApiError(400, "'stream_options' must be an object", param="stream_options")
        top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
        return cls(max_tokens=max_tokens,
                   temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                   top_p=None if top_p >= 1.0 else max(top_p, 1e-9),
                   top_k=_number(body, "top_k", None, 1, 1 << 20, integer=True),
                   n=_number(body, "n", 1, 1, MAX_N, integer=True), stop=stop,
                   seed=_number(body, "seed", None, -(1 << 63), (1 << 63) - 1, integer=True),
                   stream=stream, include_usage=bool(options.get("include_usage", False)))


def check_model(body: dict, served: str) -> None:
    """The request's ``model`` must name the one model this server runs (404 otherwise)."""
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "'model' is required: the name /v1/models lists", param="model")
    if name != served:
        raise ApiError(404, f"the model '{name}' does not exist; this server runs '{served}'",
                       param="model", code="model_not_found")


def too_long(prompt_tokens: int, max_tokens: int, context: int, param: str) -> ApiError:
    return ApiError(400, f"this model's context is {context} tokens, but the request needs "
                         f"{prompt_tokens + max_tokens} ({prompt_tokens} in the prompt, "
                         f"{max_tokens} to generate); shorten the prompt or lower max_tokens",
                    param=param, code="context_length_exceeded")


# --- responses -------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(rid: str, model: str, texts: list[str], finishes: list[str],
               prompt_tokens: int, completion_tokens: int, chat: bool) -> dict[str, Any]:
    """The whole response of ``/v1/completions`` (``chat``: ``/v1/chat/completions``)."""
    if chat:
        choices = [{"index": i, "message": {"role": "assistant", "content": t},
                    "logprobs": None, "finish_reason": f}
                   for i, (t, f) in enumerate(zip(texts, finishes, strict=True))]
    else:
        choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": f}
                   for i, (t, f) in enumerate(zip(texts, finishes, strict=True))]
    return {"id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage(prompt_tokens, completion_tokens)}


def chunk(rid: str, model: str, index: int, text: str | None, finish: str | None, chat: bool,
          role: bool = False) -> dict[str, Any]:
    """One server-sent event of a streamed response: ``text`` added to choice ``index``;
    ``role`` opens a chat choice (``{"role": "assistant", "content": ""}``)."""
    if chat:
        delta: dict[str, Any] = {}
        if role:
            delta = {"role": "assistant", "content": ""}
        elif text:
            delta = {"content": text}
        choice: dict[str, Any] = {"index": index, "delta": delta}
    else:
        choice = {"index": index, "text": text or ""}
    choice.update(logprobs=None, finish_reason=finish)
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}


def sse(data: dict[str, Any] | str) -> bytes:
    """A server-sent event: ``data: <json>`` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()
