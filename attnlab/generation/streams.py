"""Decoded text, streamed: the newest text of a growing list of token ids, released piece by
piece, and the writer that ``generate`` and ``chat`` print it with (``serve`` sends the same
pieces as server-sent chunks)."""

from __future__ import annotations

import sys
import time

# Decoding yields token ids; a client wants text. Two things make the newest text provisional:
# a byte-level token may end inside a UTF-8 character (it decodes to U+FFFD until the next
# token completes it), and the text may end in the beginning of a stop string (``<|im_`` before
# ``end|>``), which must not be shown if the stop string follows. TextStream holds such an end
# back until a later token settles it and cuts the text before the first stop string; `attnlab
# serve` sends its pieces as server-sent chunks, StopStream writes them for generate and chat.

class TextStream:
    """The text of a growing list of token ids, released piece by piece. A piece is held back
    while it ends in a partial UTF-8 character (``\\ufffd``) or in what could be the start of
    a stop string; :attr:`stopped` is set (and the text cut before it) when one appears."""

    def __init__(self, decode, stops: list[str]):
        self.decode, self.stops = decode, stops
        self.ids: list[int] = []
        self.text = ""  # released so far
        self.stopped = False

    def feed(self, ids: list[int], final: bool = False) -> str:
        """Add ``ids``; the text that may be sent now (``final``: everything that is left)."""
        self.ids.extend(ids)
        if self.stopped:
            return ""
        full = self.decode(self.ids)
        hit = min((full.find(s) for s in self.stops if s in full), default=-1)
        if hit >= 0:
            self.stopped = True
            full = full[:hit]
        elif not final:
            full = full.rstrip("\ufffd")
            hold = max((k for s in self.stops for k in range(1, min(len(s), len(full) + 1))
                        if full.endswith(s[:k])), default=0)
            full = full[: len(full) - hold]
        if len(full) <= len(self.text) or not full.startswith(self.text):
            return ""
        piece, self.text = full[len(self.text):], full
        return piece


class StopStream:
    """``generate``'s ``on_token``: writes the text of the new tokens to ``out`` as it grows
    (a :class:`TextStream`), and stops at the first of ``stop_ids`` or ``stops`` (strings),
    neither of which is written. :meth:`finish` writes what is left and returns the reply.
    ``ticks`` holds when each new token was ready (the CLI's timing line).
    ``skip_special=False`` keeps special tokens in the text, so that a stop string such as
    ``<|eot_id|>`` is seen."""

    def __init__(self, tokenizer, stops=(), stop_ids=(), out=None, skip_special: bool = True):
        self.stream = TextStream(lambda ids: tokenizer.decode(ids, skip_special=skip_special),
                                 [s for s in stops if s])
        self.stop_ids = set(stop_ids)
        self.out = sys.stdout if out is None else out
        self.seen = 0  # tokens fed to the stream
        self.stopped = False
        self.ticks: list[float] = []

    def __call__(self, new_ids) -> bool:
        """``new_ids (1, n)``: every new token so far; True once a stop is reached."""
        self.ticks.append(time.perf_counter())
        ids = new_ids[0, self.seen:].tolist()
        self.seen = new_ids.shape[1]
        cut = next((i for i, t in enumerate(ids) if t in self.stop_ids), None)
        if cut is not None:
            ids, self.stopped = ids[:cut], True
        self._write(self.stream.feed(ids, final=self.stopped))
        self.stopped |= self.stream.stopped
        return self.stopped

    def _write(self, piece: str) -> None:
        if piece:
            self.out.write(piece)
            self.out.flush()

    def finish(self) -> str:
        """Write the rest of the reply (what was held back); return the whole reply."""
        self._write(self.stream.feed([], final=True))
        return self.stream.text
