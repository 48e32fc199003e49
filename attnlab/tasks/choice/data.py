"""Multiple-choice questions as JSON lines, one a line: ``context`` (str), ``choices`` (≥ 2
non-empty str), ``answer`` (the index of the right choice) and an optional ``instruction``
(str; null or "" is none). A language model scores them (:mod:`attnlab.tasks.choice.harness`)
and an encoder with a multiple-choice head is trained on and scored by them
(:mod:`attnlab.tasks.choice.head`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from attnlab.errors import BadInput
from attnlab.files import parse_json, read_text


@dataclass(frozen=True)
class Example:
    """One multiple-choice question. ``line`` (where it was read, 1-based) is not part of its
    content: two lines holding the same question are equal."""

    context: str
    choices: tuple[str, ...]
    answer: int
    instruction: str | None = None
    line: int = field(default=0, compare=False)


# --- reading ---------------------------------------------------------------------------------
def read_examples(path: str | os.PathLike) -> list[Example]:
    """Every example of a JSON-lines file (blank lines skipped); a bad line is one error
    naming ``FILE:LINE`` and the field; a file without examples is an error too."""
    text = read_text(path, "data file")
    examples = []
    for n, line in enumerate(text.split("\n"), 1):  # not splitlines: JSON may hold U+2028
        if line.strip():
            examples.append(_example(parse_json(line, path, line=n), f"{path}:{n}", n))
    if not examples:
        raise BadInput(f"{path}: no examples (one JSON object a line: context, choices, answer)")
    return examples


def _example(row: dict, where: str, line: int) -> Example:
    for name, kind in (("context", "a string"), ("choices", "a list"), ("answer", "an integer")):
        if name not in row:
            raise BadInput(f"{where}: field {name!r} missing (expected {kind}; fields: "
                           f"{', '.join(sorted(row)) or 'none'})")
    context, choices, answer = row["context"], row["choices"], row["answer"]
    instruction = row.get("instruction")
    if not isinstance(context, str):
        raise BadInput(f"{where}: 'context' must be a string, got {_kind(context)}")
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise BadInput(f"{where}: 'choices' must be a list of strings, got {_kind(choices)}")
    if len(choices) < 2:
        raise BadInput(f"{where}: 'choices' holds {len(choices)}; a question needs at least 2")
    empty = [i for i, c in enumerate(choices) if not c]
    if empty:
        raise BadInput(f"{where}: choice {empty[0]} is an empty string")
    if not isinstance(answer, int) or isinstance(answer, bool):
        raise BadInput(f"{where}: 'answer' must be the index of a choice, got {_kind(answer)}")
    if not 0 <= answer < len(choices):
        raise BadInput(f"{where}: 'answer' is {answer}, outside the {len(choices)} choices "
                       f"(0..{len(choices) - 1})")
    if instruction is not None and not isinstance(instruction, str):
        raise BadInput(f"{where}: 'instruction' must be a string, got {_kind(instruction)}")
    return Example(context, tuple(choices), answer, instruction or None, line)


def _kind(value: object) -> str:
    shown = repr(value)
    return f"{type(value).__name__} {shown if len(shown) <= 40 else shown[:37] + '...'}"


__all__ = ["Example", "read_examples"]
