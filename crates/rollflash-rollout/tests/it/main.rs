//! Integration tests of `rollflash-rollout`: backends (conformance), proxy, HTTP, EnvManager.

mod conformance;
mod http;
