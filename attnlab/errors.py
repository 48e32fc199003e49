"""attnlab's own error types: problems with what a user gave us, as opposed to bugs.

The command line turns exactly these into one line on stderr and exit code 2; any other
exception is a bug in attnlab and keeps its traceback. Each also subclasses the built-in type
that Python code would expect (``ValueError``, ``FileNotFoundError``, ``ImportError``), so
``except ValueError`` around library calls keeps working.
"""

from __future__ import annotations


class AttnlabError(Exception):
    """Base class: the message alone says what is wrong and where (file, line, argument)."""

    exit_code = 2  # what the command line exits with


class Stopped(AttnlabError):
    """A run stopped on request (SIGTERM, SIGINT) after saving its work; the message says
    where. The command line exits with 128 + the signal's number, as a shell would."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class BadInput(AttnlabError, ValueError):
    """A value, file content or setting that attnlab cannot accept."""


class MissingFile(AttnlabError, FileNotFoundError):
    """A file or folder the user named does not exist, or lacks a part it needs."""


class UnsupportedFormat(BadInput):
    """A model or file of a kind attnlab does not read (or not for this command)."""


class MissingDependency(AttnlabError, ImportError):
    """An optional package that this input needs is not installed; the message says which."""


class WriteFailed(AttnlabError):
    """A file could not be written (a full disk, a read-only or forbidden folder); nothing
    half-written is left behind."""


__all__ = ["AttnlabError", "BadInput", "MissingFile", "UnsupportedFormat", "MissingDependency",
           "Stopped", "WriteFailed"]
