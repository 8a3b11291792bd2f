#!/usr/bin/env python3
"""How long one durable write of a block takes on a disk: the floor under the `disk` level's
group commit.

The embedded store at `disk` makes a batch durable with one synchronous direct write
(`O_DIRECT | O_DSYNC`) into a log segment zero-filled beforehand. This writes 4 KiB blocks the
same way, one after another, into a zero-filled file of 64 MiB in DIR (the disk to measure; the
file is removed after), and prints the latency's percentiles:

    sync-write.py /work/main/target/tmp 3000

With N callers each waiting for its own operation, a group commit serves at most N operations
per write, so N / p50 operations a second is a ceiling no design beats on that disk.
"""
import mmap
import os
import statistics
import sys
import time


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    writes = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    size = 64 << 20
    path = os.path.join(directory, f"sync-write-{os.getpid()}.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        zeros = b"\0" * (1 << 20)
        for offset in range(0, size, len(zeros)):
            os.pwrite(fd, zeros, offset)
        os.fsync(fd)
        os.close(fd)
        fd = os.open(path, os.O_RDWR | os.O_DIRECT | os.O_DSYNC)
        block = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
        block.write(b"x" * 4096)
        latencies = []
        for i in range(writes):
            started = time.perf_counter()
            os.pwrite(fd, block, (i * 4096) % size)
            latencies.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        os.unlink(path)
    latencies.sort()
    ms = lambda q: latencies[min(len(latencies) - 1, int(len(latencies) * q))] * 1e3
    print(
        f"{writes} writes of 4 KiB, O_DIRECT|O_DSYNC: p50 {ms(0.5):.3f} ms  p90 {ms(0.9):.3f}  "
        f"p99 {ms(0.99):.3f}  mean {statistics.mean(latencies) * 1e3:.3f}"
    )


if __name__ == "__main__":
    main()
