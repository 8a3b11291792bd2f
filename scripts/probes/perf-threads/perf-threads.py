#!/usr/bin/env python3
"""Where a daemon's CPU went, thread by thread, from `perf script` output.

Record one benchmark round with call graphs, then write the samples out:

    perf record -F 999 --call-graph dwarf,16384 -o round.data -- \
        target/dist/allot bench apps --run --one-call --tasks 50000 --rounds 1
    perf script -i round.data -F comm,tid,ip,sym > round.txt

Then:

    perf-threads.py round.txt                      # samples per thread
    perf-threads.py round.txt --thread TID         # that thread: inclusive and self shares
    perf-threads.py round.txt --thread TID --grep allot_   # only frames whose name has allot_

A frame counts once per sample for its inclusive share (recursion is not counted twice). Samples
whose stack the unwinder could not follow (in glibc's memcpy, in page faults) count only for
their own frame: read a thread's unattributed share as such, not as idle.
"""
import argparse
import collections
import re


def samples(path):
    """Yields (comm tid, [frames, innermost first]) for each sample."""
    head, frames = None, []
    with open(path, errors="replace") as lines:
        for line in lines:
            if not line.strip():
                if head is not None:
                    yield head, frames
                head, frames = None, []
            elif not line.startswith((" ", "\t")):
                parts = line.split()
                head = " ".join(parts[:2])
            else:
                parts = line.strip().split(None, 1)
                frames.append(re.sub(r"\+0x[0-9a-f]+$", "", parts[1] if len(parts) > 1 else "?"))
    if head is not None:
        yield head, frames


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("script", help="the output of `perf script -F comm,tid,ip,sym`")
    parser.add_argument("--thread", help="a thread id (or `comm tid`) to break down")
    parser.add_argument("--grep", help="show only frames whose name contains this")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()

    every = list(samples(args.script))
    print(f"{len(every)} samples")
    for thread, count in collections.Counter(head for head, _ in every).most_common(12):
        print(f"{count:7d}  {thread}")
    if not args.thread:
        return
    mine = [frames for head, frames in every if head == args.thread or head.split()[-1] == args.thread]
    if not mine:
        raise SystemExit(f"no samples of thread {args.thread}")
    inclusive, own = collections.Counter(), collections.Counter()
    for frames in mine:
        inclusive.update(set(frames))
        if frames:
            own[frames[0]] += 1
    keep = (lambda name: args.grep in name) if args.grep else (lambda name: True)
    print(f"\nthread {args.thread}: {len(mine)} samples\n-- inclusive")
    for name, count in [(n, c) for n, c in inclusive.most_common() if keep(n)][: args.top]:
        print(f"{100 * count / len(mine):5.1f}%  {name[:160]}")
    print("-- self")
    for name, count in [(n, c) for n, c in own.most_common() if keep(n)][: args.top]:
        print(f"{100 * count / len(mine):5.1f}%  {name[:160]}")


if __name__ == "__main__":
    main()
