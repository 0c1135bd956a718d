"""gfd.Error raised from the package's Python code, with the attributes the compiled ones carry."""

from __future__ import annotations

from typing import Optional

from ._gfd import Error, InvalidArgument, InvalidType


def _error(message: str, code: str = "invalid_argument", block: Optional[int] = None) -> Error:
    """A gfd.Error: an InvalidArgument for code 'invalid_argument'."""
    e = (InvalidArgument if code == "invalid_argument" else Error)(message)
    e.code = code
    e.block = block
    return e


def _type_error(message: str) -> Error:
    """A gfd.InvalidType (an argument of the wrong type)."""
    e = InvalidType(message)
    e.code = "invalid_argument"
    e.block = None
    return e
