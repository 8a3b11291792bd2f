"""A clock only the test moves (``allot.Clock``), for the client's helpers: a wait on it ends when
:meth:`ManualClock.advance` passes its end (or, for :meth:`ManualClock.wait`, when it is stopped),
never by itself; and the test sees which waits are under way."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable, List, Tuple


class ManualClock:
    def __init__(self) -> None:
        self._now = 0.0
        self._changed = threading.Condition()
        #: The ends of the blocking waits under way.
        self._blocked: List[float] = []
        #: The asynchronous waits under way: their end, loop and future.
        self._timers: List[Tuple[float, asyncio.AbstractEventLoop, "asyncio.Future[None]"]] = []

    def now(self) -> float:
        with self._changed:
            return self._now

    def advance(self, seconds: float) -> None:
        """Moves the time on: every wait that ends by then ends."""
        with self._changed:
            self._now += seconds
            due = [t for t in self._timers if t[0] <= self._now]
            self._timers = [t for t in self._timers if t[0] > self._now]
            self._changed.notify_all()
        for _, loop, future in due:
            loop.call_soon_threadsafe(_wake, future)

    def waiting(self) -> int:
        """How many waits are under way that end after now."""
        with self._changed:
            return sum(1 for end in self._blocked if end > self._now) + len(self._timers)

    def sleep(self, seconds: float) -> None:
        self.wait(threading.Event(), seconds)

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        with self._changed:
            end = self._now + seconds
            self._blocked.append(end)
            self._changed.notify_all()
            try:
                while not stop.is_set() and self._now < end:
                    # Woken by advance(); a set `stop` (which cannot notify this condition) is
                    # looked at every 10 ms.
                    self._changed.wait(0.01)
            finally:
                self._blocked.remove(end)
            return stop.is_set()

    async def asleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        future: "asyncio.Future[None]" = loop.create_future()
        with self._changed:
            end = self._now + seconds
            if end <= self._now:
                return
            entry = (end, loop, future)
            self._timers.append(entry)
        try:
            await future
        finally:
            with self._changed:
                if entry in self._timers:
                    self._timers.remove(entry)


def _wake(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


def until(what: str, check: Callable[[], bool]) -> None:
    """Waits until ``check()`` holds; fails after 60 s (a bound for a slow machine, never a
    measure), naming ``what`` was awaited."""
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, f"{what}: not so after 60 s"
        time.sleep(0.01)  # polls what the daemon or another thread makes true
