"""allot for Python: a typed client of allot's API (blocking :class:`Client` and asynchronous
:class:`AsyncClient`, the same methods) and a kit for plugins served in Python
(:mod:`allot.plugin`).

    import allot

    client = allot.Client()                       # ALLOT_SERVER, else http://127.0.0.1:7070
    with client.token("api:openai", units=2, wait=30) as grant:
        ...                                       # at most the quota's units run this at once
"""

from . import models
from ._async import AsyncClient
from ._codes import *  # noqa: F401,F403
from ._codes import __all__ as _code_names
from ._sync import Client
from ._util import Clock, SystemClock
from .errors import (
    AllotError,
    AppFailed,
    ConflictError,
    ConnectionFailed,
    Exhausted,
    Forbidden,
    Gone,
    InvalidRequest,
    NamespaceQuotaExceeded,
    NotFoundError,
    NotGranted,
    Unauthenticated,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "AllotError",
    "AppFailed",
    "AsyncClient",
    "Client",
    "Clock",
    "ConflictError",
    "ConnectionFailed",
    "Exhausted",
    "Forbidden",
    "Gone",
    "InvalidRequest",
    "NamespaceQuotaExceeded",
    "NotFoundError",
    "NotGranted",
    "SystemClock",
    "Unauthenticated",
    "Unavailable",
    "models",
    *_code_names,
]
