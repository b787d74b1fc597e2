//! Tests of `latency`.
