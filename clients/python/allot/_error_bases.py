"""The bases of the error classes (:mod:`allot.errors` names them all), and the errors of the
client's own. The generated class of each error code (``_codes.py``) derives from one of them;
nothing here imports it."""

from __future__ import annotations

from typing import Any, Dict, Optional


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


__all__ = [
    "AllotError",
    "AppFailed",
    "ConflictError",
    "ConnectionFailed",
    "Exhausted",
    "Forbidden",
    "Gone",
    "InvalidRequest",
    "NamespaceQuotaExceeded",
    "NotFoundError",
    "NotGranted",
    "Unauthenticated",
    "Unavailable",
]
