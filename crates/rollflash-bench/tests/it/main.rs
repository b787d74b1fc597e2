//! Integration tests of `rollflash-bench`: the pure parts of the simulator's calibration
//! (no engine, no learner, no timing thresholds).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod calibrate;
