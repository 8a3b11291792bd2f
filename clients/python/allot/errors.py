"""Errors: one exception class per error code of allot's API, each carrying the code, the
message and the HTTP status of the answer (``{"error": {"code": ..., "message": ...}}``).

Classes are grouped by what the caller can do about them: :class:`InvalidRequest` (400: fix the
call), :class:`NotFoundError` (404), :class:`ConflictError` (409: the state says no),
:class:`Unavailable` (503: retry; the client already retried, bounded). Every class derives from
:class:`AllotError`.

The bases live in ``_error_bases.py`` and the class of each code in the generated ``_codes.py``,
which imports the bases: this module imports both, and neither imports it.
"""

from __future__ import annotations

from typing import Dict, Type

from ._codes import *  # noqa: F401,F403  (every code's class, beside their bases)
from ._codes import ERRORS
from ._error_bases import *  # noqa: F401,F403
from ._error_bases import (
    AllotError,
    ConflictError,
    Forbidden,
    Gone,
    InvalidRequest,
    NotFoundError,
    Unauthenticated,
    Unavailable,
)


def error_for(status: int, code: str, message: str) -> AllotError:
    """The exception of an error answer: the class of its code, else of its status."""
    cls = ERRORS.get(code)
    if cls is None:
        by_status: Dict[int, Type[AllotError]] = {
            400: InvalidRequest,
            401: Unauthenticated,
            403: Forbidden,
            404: NotFoundError,
            409: ConflictError,
            410: Gone,
        }
        cls = by_status.get(status, Unavailable if status >= 500 else AllotError)
    return cls(message, code=code, status=status)

