"""Limiting concurrent calls to an outside API across many worker processes: each call holds a
token of the quota ``api:example`` while it runs, so however many workers there are, at most
the quota's calls run at once (and a crashed worker's token comes back when its lease ends).

    ALLOT_SERVER=http://127.0.0.1:7070 python3 limit_api_calls.py --workers 8 --quota 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from typing import Any

import allot

NAMESPACE = "api:example"


def call_the_api(running: Any, most: Any, lock: Any) -> None:
    """Stands for a call to a rate-limited service: it notes how many run at once."""
    with lock:
        running.value += 1
        most.value = max(most.value, running.value)
    time.sleep(0.05)
    with lock:
        running.value -= 1


def worker(calls: int, running: Any, most: Any, lock: Any) -> None:
    client = allot.Client()

    @client.limited(NAMESPACE, wait=60)
    def limited_call() -> None:
        call_the_api(running, most, lock)

    for _ in range(calls):
        limited_call()
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=5, help="calls per worker")
    parser.add_argument("--quota", type=int, default=3)
    args = parser.parse_args()
    with allot.Client() as client:
        client.put_namespace(NAMESPACE, args.quota)
    running, most = multiprocessing.Value("i", 0), multiprocessing.Value("i", 0)
    lock = multiprocessing.Lock()
    workers = [
        multiprocessing.Process(target=worker, args=(args.calls, running, most, lock)) for _ in range(args.workers)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join()
        if process.exitcode != 0:
            raise SystemExit(f"a worker failed ({process.exitcode})")
    print(f"{args.workers * args.calls} calls by {args.workers} workers, at most {most.value} at once (quota {args.quota})")
    if most.value > args.quota:
        raise SystemExit("the quota was exceeded")


if __name__ == "__main__":
    main()
