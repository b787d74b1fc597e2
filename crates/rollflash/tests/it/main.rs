//! Integration tests of the `rollflash` binary: real processes on loopback ports.

mod env_serve;
mod serve;
