//! allot-sim's tests: its seeds in the normal suite, and the seeds that found bugs.

mod regressions;
mod replicated;
mod seeds;
