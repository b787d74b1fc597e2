//! Integration tests of `rollflash-core`: the scheduling state machines.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod buffer;
mod controller;
mod proxy;
mod timeline;
