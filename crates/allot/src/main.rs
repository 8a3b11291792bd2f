//! The `allot` binary: the command line of the `allot` library ([`allot::main`]), with mimalloc
//! as the allocator.

use std::process::ExitCode;

/// mimalloc instead of the C library's allocator: glibc's took about 12 µs of the daemon's CPU per
/// allocate+release pair, and with mimalloc the disk level served more pairs/s in 5 of 5
/// alternating rounds (docs/benchmarks.md).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    allot::main()
}
