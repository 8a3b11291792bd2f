"""What the Python client costs: token allocate+release pairs per second through ``allot.Client``
and ``allot.AsyncClient`` against the same calls made with plain httpx, by ``--workers`` workers
(threads for the blocking client, tasks for the asyncio one), in rounds that alternate the two,
so that both see the same daemon and the same machine.

    allot serve --quota bench=1000000 &
    python3 bench/pairs.py --url http://127.0.0.1:7070 --workers 16 --seconds 5 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from typing import Awaitable, Callable, Dict, List

import httpx

import allot

NAMESPACE = "bench"


def sync_rate(worker: Callable[[int, Callable[[], bool]], int], workers: int, seconds: float) -> float:
    """Pairs per second of ``workers`` threads running ``worker(i, running)`` for ``seconds``."""
    stop = time.monotonic() + seconds
    counts: List[int] = [0] * workers

    def run(i: int) -> None:
        counts[i] = worker(i, lambda: time.monotonic() < stop)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - start)


def client_sync(url: str, workers: int, seconds: float) -> float:
    with allot.Client(url) as client:

        def worker(i: int, running: Callable[[], bool]) -> int:
            n = 0
            while running():
                token = f"c{i}-{n}"
                client.allocate(NAMESPACE, token)
                client.release(NAMESPACE, token)
                n += 1
            return n

        return sync_rate(worker, workers, seconds)


def httpx_sync(url: str, workers: int, seconds: float) -> float:
    with httpx.Client(base_url=url) as http:

        def worker(i: int, running: Callable[[], bool]) -> int:
            n = 0
            while running():
                path = f"/v1/namespaces/{NAMESPACE}/grants/h{i}-{n}"
                http.put(path, json={"units": 1}).raise_for_status()
                http.delete(path).raise_for_status()
                n += 1
            return n

        return sync_rate(worker, workers, seconds)


async def async_rate(pair: Callable[[int, int], Awaitable[None]], workers: int, seconds: float) -> float:
    stop = time.monotonic() + seconds

    async def worker(i: int) -> int:
        n = 0
        while time.monotonic() < stop:
            await pair(i, n)
            n += 1
        return n

    start = time.monotonic()
    counts = await asyncio.gather(*(worker(i) for i in range(workers)))
    return sum(counts) / (time.monotonic() - start)


def client_async(url: str, workers: int, seconds: float) -> float:
    async def main() -> float:
        async with allot.AsyncClient(url) as client:

            async def pair(i: int, n: int) -> None:
                token = f"a{i}-{n}"
                await client.allocate(NAMESPACE, token)
                await client.release(NAMESPACE, token)

            return await async_rate(pair, workers, seconds)

    return asyncio.run(main())


def httpx_async(url: str, workers: int, seconds: float) -> float:
    async def main() -> float:
        async with httpx.AsyncClient(base_url=url) as http:

            async def pair(i: int, n: int) -> None:
                path = f"/v1/namespaces/{NAMESPACE}/grants/x{i}-{n}"
                (await http.put(path, json={"units": 1})).raise_for_status()
                (await http.delete(path)).raise_for_status()

            return await async_rate(pair, workers, seconds)

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description="allocate+release pairs/s: allot's Python client vs plain httpx")
    parser.add_argument("--url", default="http://127.0.0.1:7070")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with allot.Client(args.url) as client:
        client.put_namespace(NAMESPACE, 1_000_000)
    runs: Dict[str, Callable[[str, int, float], float]] = {
        "httpx, blocking": httpx_sync,
        "allot.Client": client_sync,
        "httpx, asyncio": httpx_async,
        "allot.AsyncClient": client_async,
    }
    rates: Dict[str, List[float]] = {name: [] for name in runs}
    for name, run in runs.items():  # warm up: connections, the daemon's caches
        run(args.url, args.workers, 0.5)
    for _ in range(args.rounds):
        for name, run in runs.items():
            rates[name].append(run(args.url, args.workers, args.seconds))
    print(f"{args.workers} workers, {args.rounds} rounds of {args.seconds:g} s; pairs/s (median of rounds)")
    for name, values in rates.items():
        print(f"  {name:<18} {statistics.median(values):>9.0f}   rounds: {', '.join(f'{v:.0f}' for v in values)}")
    for ours, plain in (("allot.Client", "httpx, blocking"), ("allot.AsyncClient", "httpx, asyncio")):
        ratio = statistics.median(rates[ours]) / statistics.median(rates[plain])
        print(f"  {ours} / {plain}: {ratio:.3f} (the client costs {max(0.0, 1 / ratio - 1) * 100:.1f}% more time)")


if __name__ == "__main__":
    main()
