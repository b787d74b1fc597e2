//! Integration tests of `rollflash-rollout`: backends (conformance), proxy, HTTP, EnvManager,
//! `VllmBackend` against a real vLLM server, and `TinkerBackend` against a real SkyRL Tinker
//! server.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod conformance;
mod env_manager;
mod faults;
mod fuzz_http;
mod http;
mod lora;
mod paths;
mod proxy;
mod publish;
mod tinker;
mod vllm;
