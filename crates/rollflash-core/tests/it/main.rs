//! Integration tests of `rollflash-core`: the scheduling state machines.

mod proxy;
