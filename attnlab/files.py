"""Reading the text and JSON files users give: whole files, lines (plain or ``.gz``), JSON
documents.

Every failure is one :class:`~attnlab.errors.AttnlabError` naming the file and, where there is
one, the line. Python's readers fail in more ways than a missing file or ``JSONDecodeError``: a
directory where a file belongs, bytes that are not UTF-8, a damaged ``.gz`` stream, a number of
thousands of digits (``ValueError``), nesting too deep to parse (``RecursionError``), and a
valid document of the wrong kind (a list where an object is expected). Every reader of a
user's text or JSON file in attnlab goes through this module.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnlab.errors import BadInput, MissingFile


def read_text(path: str | os.PathLike, what: str = "file", allow_empty: bool = True) -> str:
    """A whole UTF-8 file. A missing file, a directory, bytes that are not UTF-8 (named with
    their line and byte) and, unless ``allow_empty``, a file of only whitespace are one-line
    errors; ``what`` names the file in them ("config file", "text file")."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise MissingFile(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: a directory, not a {what}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise BadInput(f"{path}:{line}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    if not allow_empty and not text.strip():
        raise BadInput(f"{path}: the {what} is empty")
    return text


def text_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a plain or ``.gz`` UTF-8 file, with their newlines (``\r\n`` read as
    ``\n``); a line that is not UTF-8, or a damaged ``.gz``, is a one-line error naming the
    file and the line. Each line is decoded on its own, so the line named is the one at fault
    (a text-mode file decodes in chunks, ahead of the lines it has handed out)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingFile(f"{path}: no such file")
    opener = gzip.open if path.endswith(".gz") else open
    read = 0  # lines read so far: an error is on line read + 1
    try:
        with opener(path, "rb") as f:
            for raw in f:
                line = raw.decode("utf-8")
                read += 1
                yield line[:-2] + "\n" if line.endswith("\r\n") else line
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}:{read + 1}: not UTF-8 text ({e.reason})") from None
    except (OSError, EOFError, zlib.error) as e:  # zlib.error: a damaged .gz stream
        raise BadInput(f"{path}:{read + 1}: cannot be read ({e})") from None


def read_lines(path: str | os.PathLike) -> list[str]:
    """Lines of a plain or ``.gz`` UTF-8 file, without their newlines."""
    return [line.rstrip("\n").rstrip("\r") for line in text_lines(path)]


def parse_json(text: str, where: str | os.PathLike, what: str = "JSON",
               line: int | None = None, require_object: bool = True) -> Any:
    """The JSON document ``text`` read from ``where`` (``line``: the line it is on, for a JSON
    lines file); with ``require_object``, anything but an object is an error too."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"{where}:{line or e.lineno}: invalid {what} ({e.msg})") from None
    except (ValueError, RecursionError) as e:  # a 5,000-digit number, nesting too deep
        at = f"{where}:{line}" if line else f"{where}"
        raise BadInput(f"{at}: unreadable {what} ({e})") from None
    if require_object and not isinstance(data, dict):
        at = f"{where}:{line}" if line else f"{where}"
        raise BadInput(f"{at}: expected a JSON object, got {type(data).__name__}")
    return data


def read_json(path: str | os.PathLike, what: str = "JSON", missing: str = "file") -> dict:
    """A JSON object from a UTF-8 file (``missing`` names the file when it is not there)."""
    return parse_json(read_text(path, missing), path, what)
