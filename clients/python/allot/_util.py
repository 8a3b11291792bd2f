"""What the blocking and the asynchronous clients do differently (sleeping, keeping a lease alive
in the background), and what they share (options, retries, resources, application files, the
clock their helpers read)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, Mapping, Optional, Protocol, Tuple, Union
from urllib.parse import quote

from .errors import AllotError, ConnectionFailed, error_for

#: Where the daemon listens by default (``allot serve``'s default), unless ``ALLOT_SERVER`` says.
DEFAULT_URL = "http://127.0.0.1:7070"
USER_AGENT = "allot-python/0.1"


@dataclass(frozen=True)
class Options:
    """How a client reaches the daemon; see :class:`allot.Client`."""

    url: str
    token: Optional[str]
    ca_cert: Optional[str]
    client_cert: Optional[Tuple[str, str]]
    timeout: float
    retries: int
    backoff: float

    @staticmethod
    def resolve(
        url: Optional[str],
        token: Optional[str],
        ca_cert: Optional[str],
        client_cert: Optional[Tuple[str, str]],
        timeout: float,
        retries: int,
        backoff: float,
    ) -> "Options":
        """The options given, else the environment the CLI reads (``ALLOT_SERVER``,
        ``ALLOT_TOKEN``, ``ALLOT_CA_CERT``, ``ALLOT_CLIENT_CERT`` and ``ALLOT_CLIENT_KEY``)."""
        env = os.environ
        url = (url or env.get("ALLOT_SERVER") or DEFAULT_URL).rstrip("/")
        if "://" not in url:
            url = "http://" + url
        if client_cert is None and env.get("ALLOT_CLIENT_CERT") and env.get("ALLOT_CLIENT_KEY"):
            client_cert = (env["ALLOT_CLIENT_CERT"], env["ALLOT_CLIENT_KEY"])
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        return Options(
            url=url,
            token=token if token is not None else env.get("ALLOT_TOKEN") or None,
            ca_cert=ca_cert or env.get("ALLOT_CA_CERT") or None,
            client_cert=client_cert,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
        )

    def http_args(self) -> Dict[str, Any]:
        """The arguments of ``httpx.Client`` and ``httpx.AsyncClient``."""
        headers = {"User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        args: Dict[str, Any] = {"base_url": self.url, "headers": headers, "timeout": self.timeout}
        if self.ca_cert or self.client_cert:
            import ssl

            context = ssl.create_default_context(cafile=self.ca_cert)
            if self.client_cert:
                context.load_cert_chain(*self.client_cert)
            args["verify"] = context
        return args


def seg(name: str) -> str:
    """A name as one path segment: every character but unreserved ones percent-encoded."""
    return quote(name, safe="")


def fresh_token(prefix: str = "py") -> str:
    """A token name no other caller uses."""
    return f"{prefix}-{secrets.token_hex(8)}"


#: Codes of a 503 whose change was surely not made: any call may be sent again.
NOT_APPLIED = {"store_unavailable", "shutting_down", "starting"}


def retry_delay(attempt: int, backoff: float, retry_after: Optional[str]) -> float:
    """How long to wait before attempt ``attempt + 1``: ``Retry-After`` when given (at most 10 s),
    else exponential from ``backoff``, at most 5 s."""
    if retry_after:
        try:
            return min(max(float(retry_after), 0.0), 10.0)
        except ValueError:
            pass
    return float(min(backoff * (2**attempt), 5.0))


def may_retry(status: Optional[int], code: Optional[str], idempotent: bool, sent: bool) -> bool:
    """Whether a failed call may be sent again. A call that never left (no connection) may
    always; one whose change may have been made only when sending it twice does no harm."""
    if status is None:
        return idempotent or not sent
    if status == 503:
        return idempotent or code in NOT_APPLIED
    return False


def raise_for(status: int, body: bytes) -> None:
    """Raises the error of an answer that is not a success."""
    if status < 400:
        return
    code, message = "error", body.decode("utf-8", "replace")[:500]
    try:
        error = json.loads(body)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        pass
    raise error_for(status, code, message)


SNAPSHOT_MAGIC = b"allot-snapshot\n"


def check_snapshot(path: Path) -> Dict[str, Any]:
    """Reads the archive at ``path`` whole and checks it as ``allot snapshot status`` does: its
    first line, its header, and the SHA-256 of everything before its last 32 bytes, which they
    hold. Answers the header with the archive's ``bytes`` and ``sha256``; raises ``AllotError``
    (code ``snapshot_damaged``) for an archive cut short or altered."""
    def damaged(why: str) -> AllotError:
        return AllotError(f"{path}: {why}", code="snapshot_damaged")

    digest = hashlib.sha256()
    size = path.stat().st_size
    if size < len(SNAPSHOT_MAGIC) + 33:
        raise damaged("not an allot snapshot, or one cut short")
    with open(path, "rb") as archive:
        first = archive.readline()
        header_line = archive.readline()
        if first != SNAPSHOT_MAGIC:
            raise damaged("not an allot snapshot (it does not start with `allot-snapshot`)")
        digest.update(first)
        digest.update(header_line)
        left = size - len(first) - len(header_line) - 32
        if left < 1:
            raise damaged("cut short before its checksum")
        while left > 0:
            chunk = archive.read(min(left, 1 << 20))
            if not chunk:
                raise damaged("cut short")
            if left == len(chunk) and chunk[-1:] != b"\xff":
                raise damaged("cut short: its records do not end where its checksum starts")
            digest.update(chunk)
            left -= len(chunk)
        recorded = archive.read(32)
    if recorded != digest.digest():
        raise damaged(f"its checksum does not match its content (recorded {recorded.hex()}, computed {digest.hexdigest()})")
    try:
        header: Dict[str, Any] = json.loads(header_line)
    except ValueError as err:
        raise damaged(f"its header does not read: {err}") from err
    return {**header, "bytes": size, "sha256": digest.hexdigest()}


def sync_directory(path: Path) -> None:
    """Makes a rename in ``path`` durable (POSIX; nothing elsewhere)."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def connection_failed(err: Exception, url: str) -> AllotError:
    """The error of a call to ``url`` that no daemon answered: it names the URL."""
    return ConnectionFailed(f"the daemon at {url} did not answer: {err}")


def read_app(app: Union[Mapping[str, Any], str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """An application: a dict as it is, or a file's (YAML with PyYAML installed, or TOML)."""
    if isinstance(app, Mapping):
        return dict(app)
    path = Path(app)
    text = path.read_text()
    if path.suffix == ".toml":
        try:
            import tomllib  # type: ignore[import-not-found,unused-ignore]
        except ImportError:  # Python before 3.11
            import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]
        loaded: Any = tomllib.loads(text)
    elif path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as err:
            raise ImportError("reading YAML needs PyYAML: pip install 'allot[yaml]'") from err
        loaded = yaml.safe_load(text)
    else:
        raise ValueError(f"{path}: an application file ends in .yaml, .yml or .toml")
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: does not hold one application")
    return loaded


#: The states an application ends in, and a task.
APP_ENDED = ("Completed", "Failed", "Rejected")
TASK_ENDED = ("Completed", "Failed", "Killed", "Rejected")


class Clock(Protocol):
    """Where a client's helpers take their time (the keepalives of ``token`` and ``alloc``, the
    waits between retries, ``run``'s timeout): every reading and every wait. The default is the
    machine's (:class:`SystemClock`); a test gives one it moves by hand."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def sleep(self, seconds: float) -> None:
        """Blocks for ``seconds``."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Waits ``seconds`` in the event loop."""
        ...

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Blocks until ``stop`` is set or ``seconds`` have passed; says whether it was set."""
        ...


class SystemClock:
    """The machine's clock: ``time.monotonic``, ``time.sleep``, ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        return stop.wait(seconds)


SYSTEM_CLOCK: Clock = SystemClock()


class _Keeper:
    """Calls ``renew`` every ``period`` seconds of ``clock`` on a thread of its own until
    stopped; the first error ends it and is kept in ``error``."""

    def __init__(self, renew: Callable[[], object], period: float, clock: Clock) -> None:
        self.error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._renew, self._period, self._clock = renew, period, clock
        self._thread = threading.Thread(target=self._run, name="allot-keepalive", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._clock.wait(self._stop, self._period):
            try:
                self._renew()
            except AllotError as err:
                if isinstance(err, ConnectionFailed):
                    continue  # the lease outlives a few missed renewals; the next one may pass
                self.error = err
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class _AsyncKeeper:
    """Awaits ``renew()`` every ``period`` seconds of ``clock`` in a task of its own until
    stopped; the first error ends it and is kept in ``error``."""

    def __init__(self, renew: Callable[[], Awaitable[object]], period: float, clock: Clock) -> None:
        self.error: Optional[BaseException] = None
        self._renew, self._period, self._clock = renew, period, clock
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await self._clock.asleep(self._period)
            try:
                await self._renew()
            except AllotError as err:
                if isinstance(err, ConnectionFailed):
                    continue
                self.error = err
                return

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
