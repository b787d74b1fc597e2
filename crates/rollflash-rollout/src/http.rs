//! HTTP client backends: SGLang-native and OpenAI-compatible servers.
