//! The Backend conformance suite, run against the engine backend.
