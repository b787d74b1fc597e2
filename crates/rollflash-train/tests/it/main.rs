//! The train crate's one integration-test binary.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod advantage;
mod common;
mod config;
mod gigpo;
mod kl;
mod layout;
mod random;
mod reference;
mod running;
mod sanity;
mod shaping;
