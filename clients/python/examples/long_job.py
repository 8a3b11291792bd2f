"""A long job keeping an alloc alive: it takes an alloc of the pool whose offer fits best,
keeps it alive in the background while it works (longer than the alloc's lease), and frees it
when done, also when the work fails.

    allot serve --pool worker=cpu=8 --run-pool worker &     # the README's daemon
    python3 long_job.py --seconds 3                          # or --pools a,b: the best fit of several
"""

from __future__ import annotations

import argparse
import time

import allot


def main() -> None:
    parser = argparse.ArgumentParser(description="holds an alloc while a long job runs")
    parser.add_argument("--pools", default="worker", help="comma-separated (the README's daemon has `worker`)")
    parser.add_argument("--min", default="cpu=2,mem=4GiB")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with allot.Client() as client:
        with client.hold_alloc(args.pools.split(","), min_resources=args.min, keepalive=0.5) as alloc:
            print(f"holding {alloc['resources']} as {alloc['uri']}")
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:  # the job's work
                time.sleep(0.5)
                expires = client.alloc(alloc["pool"], alloc["id"]).get("expires_in_ms")
                print(f"  working; the alloc's lease has {expires} ms left")
        print(f"freed: {client.alloc(alloc['pool'], alloc['id']).get('ended')}")


if __name__ == "__main__":
    main()
