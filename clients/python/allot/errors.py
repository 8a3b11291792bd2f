"""Errors: one exception class per error code of allot's API, each carrying the code, the
message and the HTTP status of the answer (``{"error": {"code": ..., "message": ...}}``).

Classes are grouped by what the caller can do about them: :class:`InvalidRequest` (400: fix the
call), :class:`NotFoundError` (404), :class:`ConflictError` (409: the state says no),
:class:`Unavailable` (503: retry; the client already retried, bounded). Every class derives from
:class:`AllotError`.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type


class AllotError(Exception):
    """An answer of allot that is an error, or a call that got no answer."""

    #: The error code (``token_conflict``), or a name of the client's own (``connection_failed``).
    code: str = "error"

    def __init__(self, message: str, *, code: Optional[str] = None, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        #: The HTTP status of the answer; ``None`` when there was no answer.
        self.status = status

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidRequest(AllotError):
    """400: the call itself is wrong."""


class Unauthenticated(AllotError):
    """401: no known API token or client certificate."""

    code = "unauthenticated"


class Forbidden(AllotError):
    """403: the caller lacks the permission the route needs."""

    code = "forbidden"


class NotFoundError(AllotError):
    """404: what the path names does not exist."""


class ConflictError(AllotError):
    """409: the state refuses the call."""


class Gone(AllotError):
    """410: it existed and ended."""


class Unavailable(AllotError):
    """503, or no answer at all: the daemon could not serve the call now."""


class ConnectionFailed(Unavailable):
    """The daemon could not be reached, or the connection broke before an answer."""

    code = "connection_failed"


class NotGranted(AllotError):
    """An allocate answered without a grant, where the caller asked for one or an error."""

    def __init__(self, message: str, answer: Dict[str, Any]) -> None:
        super().__init__(message, code=str(answer.get("status")), status=200)
        #: The allocate's answer (``AllocateResponse``): where it waited, the cap that refused it.
        self.answer = answer


class Exhausted(NotGranted):
    """The namespace's quota is full (status ``Exhausted``)."""

    code = "Exhausted"


class NamespaceQuotaExceeded(NotGranted):
    """A cap of the caller's scope is full (status ``NamespaceQuotaExceeded``)."""

    code = "NamespaceQuotaExceeded"


class AppFailed(AllotError):
    """An application followed by ``run`` ended otherwise than ``Completed``."""

    code = "app_failed"

    def __init__(self, message: str, app: Dict[str, Any]) -> None:
        super().__init__(message, status=None)
        #: The application as it ended (``App``).
        self.app = app


def error_for(status: int, code: str, message: str) -> AllotError:
    """The exception of an error answer: the class of its code, else of its status."""
    from ._codes import ERRORS

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


from ._codes import *  # noqa: E402,F401,F403  (every code's class, beside their bases)
