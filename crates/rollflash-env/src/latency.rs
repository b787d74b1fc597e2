//! A wrapper that gives any environment a configurable latency distribution and failure rate.
