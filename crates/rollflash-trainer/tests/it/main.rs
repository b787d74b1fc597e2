//! Integration tests of `rollflash-trainer`: the controller driving real proxies, engines
//! and environment managers (paused time where no real compute runs), its faults, and the
//! policy learner.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod controller;
mod faults;
mod learner;
mod tinker;
mod tinker_server;
