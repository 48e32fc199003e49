"""Chat templates: a conversation rendered into the one text a chat model was trained to read.

    [{"role": "system", ...}, {"role": "user", "content": "Hi"}]
        -> "<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n"
           "<|im_start|>assistant\\n"                      (add_generation_prompt=True)

A template is Jinja text that comes with the model (a GGUF file's ``tokenizer.chat_template``, a
Hugging Face folder's ``chat_template.jinja`` or ``tokenizer_config.json``) or from
``--chat-template FILE``. It is rendered as transformers' ``apply_chat_template`` renders it:
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception``,
``strftime_now``, a ``tojson`` that keeps non-ASCII text and does not escape HTML, and the
variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, ``bos_token``,
``eos_token`` and the caller's extra ones. The text keeps the special tokens (``<|im_start|>``)
as text; the tokenizer maps them to their ids.

A template is untrusted code, so it runs in Jinja's immutable sandbox, made stricter: touching
an attribute of Python's internals (``''.__class__``) fails at once rather than printing
nothing, ``*`` and ``**`` refuse to build huge strings or numbers, and the source (1 MiB) and
the output (16 M characters) are capped. Every failure of a template is one
:class:`~attnlab.errors.BadInput` naming where it came from and its line.
"""

from __future__ import annotations

import json
import os
import re
import traceback
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.errors import BadInput, MissingDependency, MissingFile

if TYPE_CHECKING:
    from attnlab.storage import Loaded

MAX_TEMPLATE_BYTES = 1 << 20  # real templates are at most tens of kB
MAX_OUTPUT_CHARS = 1 << 24  # a rendered prompt beyond this fits no model's context
ROLES = ("system", "user", "assistant", "tool")
_PROBE = "ATTNLAB_PROBE_REPLY"  # an assistant message whose end marker stop_strings looks for


class _Refused(Exception):
    """What a template's ``raise_exception(message)`` raises."""


@lru_cache(maxsize=1)
def _sandbox():
    """The one Jinja environment every template is compiled in (built on first use: jinja2 is
    the optional dependency of ``attnlab chat`` and ``attnlab serve``)."""
    try:
        import jinja2
        from jinja2.exceptions import SecurityError
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from jinja2.utils import Namespace
    except ImportError:
        raise MissingDependency("chat templates need jinja2 (pip install 'attnlab[serve]')") \
            from None
    found = tuple(int(x) for x in re.findall(r"\d+", jinja2.__version__)[:3])
    if found < (3, 1, 6):  # earlier versions have known escapes from the sandbox
        raise MissingDependency(f"chat templates need jinja2 >= 3.1.6, not {jinja2.__version__} "
                                "(pip install -U jinja2)")

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+"})

        def unsafe_undefined(self, obj: Any, attribute: str):
            # Jinja returns an Undefined that fails only when used: `{{ x.__class__ }}` would
            # print nothing. Fail at the access.
            raise SecurityError(f"access to attribute {attribute!r} of a "
                                f"{type(obj).__name__!r} object is unsafe")

        def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
            _check_size(operator, left, right, SecurityError)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            # "x".center(10**10), "{:999999999}".format(1): widths are refused first
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, str) and getattr(__obj, "__name__", "") in _WIDE_METHODS:
                _check_widths(None, (*args, *kwargs.values()), SecurityError)
            return super().call(__context, __obj, *args, **kwargs)

        def wrap_str_format(self, value: Any):
            # the sandbox's str.format and format_map: their format string's widths first
            if isinstance(getattr(value, "__self__", None), str):
                _check_widths(value.__self__, (), SecurityError)
            return super().wrap_str_format(value)

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers marks the assistant's
        tokens with it): the body, rendered as is."""

        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class SafeNamespace(Namespace):
        """``namespace()`` that stores no underscore names (``ns.__class__`` is blocked)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # no `self`: namespace(self=1) works
            for name in dict(*args[1:], **kwargs):
                _public(name, SecurityError)
            Namespace.__init__(*args, **kwargs)

        def __setitem__(self, name: str, value: Any) -> None:
            _public(name, SecurityError)
            if isinstance(value, (str, list, tuple, dict)) and len(value) > MAX_OUTPUT_CHARS:
                raise SecurityError(f"a value of {len(value):,} items stored on a namespace")
            Namespace.__setitem__(self, name, value)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, Generation])
    env.filters["tojson"] = _tojson
    for name in ("center", "indent", "wordwrap", "format", "tojson"):  # widths checked first
        env.filters[name] = _bounded(env.filters[name], name == "format", SecurityError)
    env.globals.update(raise_exception=_raise, strftime_now=_strftime_now,
                       namespace=SafeNamespace, dict=_make_dict)
    return env


def _raise(message: str):
    raise _Refused(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _make_dict(*args: Any, **kwargs: Any) -> dict:  # `dict(...)`, without the type itself
    return dict(*args, **kwargs)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """JSON as transformers' templates expect it: non-ASCII kept, ``<`` and ``&`` unescaped
    (Jinja's own filter escapes them for HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _public(name: Any, error: type[Exception]) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise error(f"a template may not store {name!r} (an underscore name) on a namespace")


def _check_size(operator: str, left: Any, right: Any, error: type[Exception]) -> None:
    """Refuse ``'a' * 10**9`` and ``9 ** 10**9`` before Python spends memory or time on them."""
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) \
                    and len(seq) * n > MAX_OUTPUT_CHARS:
                raise error(f"'*' would build {len(seq) * n:,} items")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) \
            and right > 0 and abs(left) > 1 and abs(left).bit_length() * right > 1 << 16:
        raise error(f"'**' would build a number of about {abs(left).bit_length() * right:,} bits")
    elif operator == "+" and isinstance(left, (str, list, tuple)) \
            and isinstance(right, (str, list, tuple)) and len(left) + len(right) > MAX_OUTPUT_CHARS:
        raise error(f"'+' would build {len(left) + len(right):,} items")


_WIDE_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs"}
# the width and precision of a %-conversion or a {}-field, where a template could ask for many
_FORMAT_WIDTHS = re.compile(r"%[-#0 +]*(\d*)(?:\.(\d*))?|\{[^{}]*?:[^{}]*?(\d+)")


def _check_widths(fmt: str | None, args: tuple, error: type[Exception]) -> None:
    """Refuse an integer argument, or a width in the format string ``fmt``, above
    :data:`MAX_OUTPUT_CHARS`: ``center(10**10)`` and ``'%999999999s'`` would build that many
    characters before the output's cap is checked."""
    widths = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
    if fmt is not None:
        widths += [int(n) for match in _FORMAT_WIDTHS.findall(fmt) for n in match if n]
    if any(abs(w) > MAX_OUTPUT_CHARS for w in widths):
        raise error(f"a width of {max(abs(w) for w in widths):,} characters")


def _bounded(function, formats: bool, error: type[Exception]):
    """A Jinja filter whose integer arguments (and, for ``format``, its format string's
    widths) are checked by :func:`_check_widths` first."""
    def bounded(value: Any, *args: Any, **kwargs: Any) -> Any:
        _check_widths(value if formats and isinstance(value, str) else None,
                      (*args, *kwargs.values()), error)
        return function(value, *args, **kwargs)
    if hasattr(function, "jinja_pass_arg"):  # wordwrap takes the environment first
        bounded.jinja_pass_arg = function.jinja_pass_arg
    return bounded


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class ChatTemplate:
    """A compiled chat template. ``origin`` says where ``source`` came from in error messages
    (``model.gguf: tokenizer.chat_template``); ``bos_token``/``eos_token`` are the strings the
    template sees under those names (None: not defined for it)."""

    def __init__(self, source: str, origin: str, bos_token: str | None = None,
                 eos_token: str | None = None):
        if not isinstance(source, str):
            raise BadInput(f"{origin}: a chat template is text, got {type(source).__name__}")
        size = len(source.encode("utf-8", "surrogatepass"))
        if size > MAX_TEMPLATE_BYTES:
            raise BadInput(f"{origin}: the chat template is {size:,} bytes, more than the "
                           f"{MAX_TEMPLATE_BYTES:,} allowed")
        self.source, self.origin = source, origin
        self.bos_token, self.eos_token = bos_token, eos_token
        env = _sandbox()  # (first: it says when jinja2 is missing)
        from jinja2.exceptions import TemplateSyntaxError

        try:
            self._template = env.from_string(source)
        except TemplateSyntaxError as e:
            raise BadInput(f"{origin}: line {e.lineno}: {_one_line(e.message or e)}") from None
        except RecursionError:  # thousands of nested brackets
            raise BadInput(f"{origin}: the chat template is nested too deeply") from None
        self._stops: list[str] | None = None

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
               **extra: Any) -> str:
        """The conversation as the model's prompt text; ``add_generation_prompt`` appends the
        header of an assistant turn. ``extra``: more template variables (``tools`` and
        ``documents`` are None unless given). A message the template refuses
        (``raise_exception``), an unsafe access or any other failure while it runs is a
        BadInput naming the template and its line."""
        from jinja2.exceptions import SecurityError, TemplateError

        values = {"tools": None, "documents": None}
        values.update({k: v for k, v in (("bos_token", self.bos_token),
                                          ("eos_token", self.eos_token)) if v is not None})
        values.update({name: _plain(value, name) for name, value in extra.items()})
        values.update(messages=check_messages(messages),
                      add_generation_prompt=bool(add_generation_prompt))
        pieces, size = [], 0
        try:
            for piece in self._template.generate(**values):
                size += len(piece)
                if size > MAX_OUTPUT_CHARS:
                    raise BadInput(f"{self.origin}: the chat template's output passed "
                                   f"{MAX_OUTPUT_CHARS:,} characters")
                pieces.append(piece)
        except BadInput:
            raise
        # a template is untrusted code: anything it raises is a fault of the template (or of
        # the conversation it refused), never of attnlab
        except Exception as e:
            where = f"{self.origin}: line {_template_line(e)}"
            if isinstance(e, _Refused):
                why = f"the template refused the conversation: {_one_line(e)}"
            elif isinstance(e, SecurityError):
                why = f"unsafe template: {_one_line(e)}"
            elif isinstance(e, TemplateError):
                why = _one_line(e.message or e)
            else:
                why = f"{type(e).__name__}: {_one_line(e)}"
            raise BadInput(f"{where}: {why}") from None
        return "".join(pieces)

    @property
    def stop_strings(self) -> list[str]:
        """Texts that end an assistant turn: the template's end-of-turn marker (``<|im_end|>``,
        ``<|eot_id|>``, ``</s>``), found by rendering an assistant message and reading the
        word after it (the part shared with and without a next message, so a template's
        closing text is not taken for it), and the eos token."""
        if self._stops is None:
            tails = []
            for after in ([], [{"role": "user", "content": "Bye"}]):
                messages = [{"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": _PROBE}, *after]
                try:
                    text = self.render(messages, add_generation_prompt=False)
                except BadInput:  # a template that insists on its own kind of conversation
                    continue
                if _PROBE in text:
                    tails.append(text[text.rindex(_PROBE) + len(_PROBE):])
            shared = os.path.commonprefix(tails) if tails else ""
            marker = shared.split()[0] if shared.split() else None
            self._stops = list(dict.fromkeys(
                s for s in (marker, self.eos_token) if s is not None and s.strip()))
        return list(self._stops)


def _template_line(error: BaseException) -> int | str:
    """The template line an error was raised at (Jinja puts its frames in the traceback)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == "<template>"]
    return frames[-1].lineno if frames else "?"


def _plain(value: Any, name: str) -> Any:
    """An extra template variable as plain JSON data: a template sees no Python objects (their
    methods are not known to the sandbox to be harmless)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, name) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v, name) for k, v in value.items()}
    raise BadInput(f"template variable {name!r}: {type(value).__name__} is not JSON data")


def check_messages(messages: Any) -> list[dict[str, str]]:
    """``messages`` as fresh plain dicts: each an object whose ``role`` is one of
    :data:`ROLES` and whose ``content`` is text; other keys (``name``) must be text too, and
    keys set to None are left out, as transformers does. A problem is one BadInput naming
    the message's index."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise BadInput("messages: expected a non-empty list of {role, content} objects")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise BadInput(f"messages[{i}]: expected an object with a role and a content, got "
                           f"{type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise BadInput(f"messages[{i}]: role {role!r} is not one of {', '.join(ROLES)}")
        plain = {}
        for key, value in message.items():
            if value is None:
                continue
            if not isinstance(key, str) or not isinstance(value, str):
                raise BadInput(f"messages[{i}]: {key!r} must be text, got "
                               f"{type(value).__name__}")
            plain[str.__str__(key)] = str.__str__(value)  # (str subclasses carry methods)
        if "content" not in plain:
            raise BadInput(f"messages[{i}]: no content")
        checked.append(plain)
    return checked


# --- where a model keeps its template ---------------------------------------------------------
def chat_template_for(loaded: Loaded, override: str | os.PathLike | None = None) -> ChatTemplate:
    """The chat template of ``loaded``: the file ``override`` (``--chat-template FILE``), else
    the model's own (:func:`template_source`). None: a one-line MissingFile saying to pass
    ``--chat-template``. The bos and eos strings are the tokenizer's (a folder's
    ``tokenizer_config.json`` names them first)."""
    folder_config = _tokenizer_config(loaded.path)
    bos, eos = _special_tokens(loaded, folder_config)
    if override is not None:
        return ChatTemplate(read_template(override), str(override), bos, eos)
    found = _find_template(Path(loaded.path), folder_config)
    if found is None:
        raise MissingFile(f"{loaded.path}: the model has no chat template (GGUF metadata "
                          "tokenizer.chat_template, chat_template.jinja or "
                          "tokenizer_config.json); pass --chat-template FILE")
    return ChatTemplate(*found, bos, eos)


def template_source(path: str | os.PathLike) -> str | None:
    """The Jinja text of the chat template that comes with the model at ``path`` (not
    compiled), or None: a GGUF file's metadata ``tokenizer.chat_template``; a Hugging Face
    folder's ``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template`` (a
    string, or a list of ``{name, template}`` of which the one named ``default``)."""
    found = _find_template(Path(path), _tokenizer_config(path))
    return None if found is None else found[0]


def _find_template(path: Path, folder_config: dict | None) -> tuple[str, str] | None:
    """``(source, where it came from)`` of :func:`template_source`."""
    if path.suffix == ".gguf" and path.is_file():
        from attnlab.interop.gguf import metadata_string

        source = metadata_string(path, "tokenizer.chat_template")
        if source is not None:
            return source, f"{path}: tokenizer.chat_template"
    elif (path / "chat_template.jinja").is_file():
        return read_template(path / "chat_template.jinja"), str(path / "chat_template.jinja")
    elif folder_config is not None and folder_config.get("chat_template") is not None:
        origin = f"{path / 'tokenizer_config.json'}: chat_template"
        return _default_template(folder_config["chat_template"], origin), origin
    return None


def read_template(path: str | os.PathLike) -> str:
    """A template file's text: missing is a MissingFile, too large or not UTF-8 a BadInput."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_TEMPLATE_BYTES:
            raise BadInput(f"{path}: the chat template is {size:,} bytes, more than the "
                           f"{MAX_TEMPLATE_BYTES:,} allowed")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFile(f"{path}: no such chat template file") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: a directory, not a chat template file") from None
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: not UTF-8 text (byte {e.start})") from None


def _default_template(value: Any, origin: str) -> str:
    """``chat_template`` of ``tokenizer_config.json``: a string, or named templates."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, Mapping) for t in value):
        named = {t.get("name"): t.get("template") for t in value}
        if isinstance(named.get("default"), str):
            return named["default"]
        raise BadInput(f"{origin}: no template named 'default' (it has {sorted(map(str, named))})"
                       "; pass --chat-template FILE")
    raise BadInput(f"{origin}: expected a string or a list of {{name, template}}, got "
                   f"{type(value).__name__}")


def _tokenizer_config(path: Path) -> dict | None:
    """A Hugging Face folder's ``tokenizer_config.json``, when it has one."""
    file = Path(path) / "tokenizer_config.json"
    if not file.is_file():
        return None
    from attnlab.files import read_json

    return read_json(file, "tokenizer config")


def _special_tokens(loaded: Loaded, folder_config: dict | None) -> tuple[str | None, str | None]:
    """``(bos_token, eos_token)``: named in ``tokenizer_config.json`` (a string, or an added
    token ``{"content": ...}``), else the tokenizer's bos and eos ids decoded with their
    special tokens kept."""
    tok = loaded.tokenizers.get("text")
    found = []
    for name in ("bos", "eos"):
        value = (folder_config or {}).get(f"{name}_token")
        if isinstance(value, Mapping):
            value = value.get("content")
        if not isinstance(value, str):
            i = None if tok is None else getattr(tok, f"{name}_id")
            value = None if i is None else (tok.decode([i], skip_special=False) or None)
        found.append(value)
    return found[0], found[1]


def stop_token_ids(tokenizer, stops: list[str]) -> set[int]:
    """The ids that end a reply: the tokenizer's eos, and each stop string that is one token
    of its own (a template's end of turn such as ``<|im_end|>`` or ``<|eot_id|>``, which text
    decoded without special tokens never shows); never ``<unk>``, which a word tokenizer gives
    for any unknown string."""
    found = {tokenizer.eos_id}
    for stop in stops:
        ids = tokenizer.encode(stop)
        if len(ids) == 1 and tokenizer.decode(ids, skip_special=False) == stop:
            found.add(ids[0])
    found.discard(None)
    return found
