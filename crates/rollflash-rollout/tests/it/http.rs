//! HTTP backends against the in-process server.
