//! Integration tests of `rollflash-dashboard`: the run directory's readers and writers, the
//! trajectory sampler, and the HTTP routes over a run directory the test writes.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod files;
mod routes;
mod trajectories;
