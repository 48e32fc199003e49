"""``attnlab serve``: a model behind OpenAI's HTTP API (FastAPI on uvicorn).

A decoder-only model answers ``/v1/completions`` and, with a chat template (its own, or
``--chat-template FILE``), ``/v1/chat/completions``; an encoder answers ``/v1/embeddings``.
It listens on 127.0.0.1 unless told otherwise; ``--api-key`` makes every request prove it.
On SIGTERM or Ctrl-C it stops accepting connections, gives the requests in flight
``--shutdown-grace`` seconds to finish, then ends the rest.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from attnlab.cli.common import (
    UsageError,
    add_compile_arg,
    add_integer_args,
    add_kv_cache_arg,
    add_model_arg,
    add_runtime_args,
    announce,
    decoding_options,
)
from attnlab.cli.http import graceful_server, listen, loopback
from attnlab.serving.prompt_cache import DEFAULT_MB


def cmd_serve(args: argparse.Namespace) -> None:
    for name in ("max_batch", "max_tokens"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got "
                             f"{getattr(args, name)}")
    if not args.request_timeout > 0 or args.shutdown_grace < 0:
        raise UsageError("--request-timeout must be > 0 and --shutdown-grace >= 0")
    if not 0 <= args.prompt_cache <= 1 << 20:
        raise UsageError(f"--prompt-cache must be between 0 and {1 << 20} MB, got "
                         f"{args.prompt_cache:g}")
    try:
        import uvicorn

        from attnlab.serving.app import create_app
    except ImportError as e:
        raise UsageError(f"attnlab serve needs {e.name}: pip install 'attnlab[serve]'") from None
    sock = listen(args.host, args.port)  # before loading: a busy port fails fast
    started = time.perf_counter()
    service = build_service(args)
    say = (lambda line: None) if args.quiet else (
        lambda line: print(f"attnlab serve: {line}", file=sys.stderr, flush=True))
    service.log = say
    api_key = args.api_key or os.environ.get("ATTNLAB_API_KEY") or None
    if api_key is None and not loopback(args.host):
        print(f"attnlab serve: warning: listening on {args.host} without --api-key: anyone who "
              "can reach this port can use the model", file=sys.stderr)
    host, port = sock.getsockname()[:2]
    say(f"model '{service.name}' ready in {time.perf_counter() - started:.2f} s; "
        f"listening on http://{host}:{port}/v1")
    config = uvicorn.Config(create_app(service, api_key), log_level="warning",
                            timeout_graceful_shutdown=args.shutdown_grace, access_log=False)
    server = graceful_server(config)
    server.run(sockets=[sock])
    if server.stopped_by is not None:
        say(f"stopped by {signal.Signals(server.stopped_by).name}")


def build_service(args: argparse.Namespace):
    """The :class:`~attnlab.serving.app.Service` of ``--model``: a decoder behind the batching
    engine (with its chat template, if any), or an encoder for embeddings."""
    from attnlab.errors import MissingFile
    from attnlab.generation.pipeline import Decoding, decoding_runtime, timing_line
    from attnlab.serving.app import Service
    from attnlab.storage import load

    options = decoding_options(args, rows=args.max_batch)
    runtime = decoding_runtime(options)
    device, precision = runtime.device, runtime.precision
    loaded = load(args.model, int4=args.int4, int8=args.int8, adapter=args.adapter)
    name = args.name or (args.model if not os.path.exists(args.model)
                         else os.path.basename(os.path.normpath(args.model)))
    common = dict(name=name, tokenizer=loaded.tokenizer, token_limit=args.max_tokens,
                  request_timeout=args.request_timeout, timing=timing_line)
    if loaded.kind == "decoder":
        from attnlab.serving.engine import Engine

        decoding = Decoding(loaded, options, runtime)
        template = None
        try:
            from attnlab.generation.chat import chat_template_for

            template = chat_template_for(loaded, args.chat_template)
        except MissingFile as e:
            if args.chat_template is not None:
                raise
            if not args.quiet:
                print(f"attnlab serve: note: no chat template ({e}); "
                      "/v1/chat/completions is off", file=sys.stderr)
        announce(args, loaded.path, device, decoding.runtime.label)
        context = loaded.config.context or loaded.config.max_len
        engine = Engine(decoding.model, args.max_batch, compiled=decoding.compiled,
                        prompt_cache_bytes=int(args.prompt_cache * (1 << 20))).start()
        if engine.compiled is not None:
            if not args.quiet:
                print("attnlab serve: compiling the decoding step (--no-compile skips it)",
                      file=sys.stderr)
            seconds = engine.warm_up()
            if not args.quiet:
                print(f"attnlab serve: compiled in {seconds:.1f} s", file=sys.stderr)
        return Service(context=context, engine=engine,
                       template=template, **common)
    if loaded.kind == "encoder":
        from attnlab.hardware import DTYPES
        from attnlab.sentence_encoder import SentenceEncoder

        for flag, value in (("--chat-template", args.chat_template),
                            ("--kv-cache", args.kv_cache)):
            if value is not None:
                raise UsageError(f"{flag} needs a decoder-only model; {loaded.path} is an "
                                 "encoder")
        model = loaded.model.to(device=device, dtype=DTYPES[precision])
        encoder = SentenceEncoder(model, loaded.tokenizer, loaded.max_len, path=loaded.path)
        announce(args, loaded.path, device, precision)
        return Service(context=loaded.max_len, encoder=encoder, **common)
    raise UsageError(f"{loaded.path}: arch={loaded.kind!r}; attnlab serve runs decoder-only "
                     "models (completions, chat) and encoders (embeddings)")


def add_commands(sub) -> None:
    serve = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                           description="Serve a decoder-only model (/v1/completions, "
                                       "/v1/chat/completions) or an encoder (/v1/embeddings) "
                                       "over OpenAI's HTTP API, batching concurrent requests.")
    add_model_arg(serve, "a run or checkpoint folder, an HF folder, a .gguf file, smollm2 or "
                         "minilm")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (0.0.0.0: every interface; add --api-key)")
    serve.add_argument("--port", type=int, default=8000, help="0: any free port")
    serve.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request "
                                         "(default: $ATTNLAB_API_KEY, else none)")
    serve.add_argument("--name", help="the model's name in the API (default: --model as given, "
                                      "or the folder's or file's name)")
    serve.add_argument("--chat-template", metavar="FILE",
                       help="a jinja chat template (default: the model's own, if it has one)")
    serve.add_argument("--max-batch", type=int, default=8,
                       help="requests decoded together; more wait their turn")
    serve.add_argument("--prompt-cache", type=float, default=float(DEFAULT_MB),
                       metavar="MB",
                       help="keep recent prompts' keys and values, up to this many MB, so a "
                            "prompt that begins as an earlier one did (a system prompt, a "
                            "chat's earlier turns) prefills only the rest (0: off)")
    serve.add_argument("--max-tokens", type=int, default=4096,
                       help="the most new tokens a request may ask for")
    serve.add_argument("--request-timeout", type=float, default=600.0,
                       help="seconds a request may decode before it ends (finish 'length')")
    serve.add_argument("--shutdown-grace", type=float, default=30.0,
                       help="on SIGTERM, seconds the requests in flight get to finish")
    add_integer_args(serve)
    add_kv_cache_arg(serve)
    add_compile_arg(serve, default=True)
    add_runtime_args(serve)
    serve.set_defaults(func=cmd_serve)
