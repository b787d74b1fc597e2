//! Integration tests of the Tinker client: against a scripted server (`mock.rs`) and against
//! a real SkyRL 0.4.0 server started once for this binary (`real.rs`, through
//! `rollflash_tinker::LocalServer`), which skips with the reason where Python 3.12 or the
//! server install is unavailable.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod archive;
mod mock;
mod real;
