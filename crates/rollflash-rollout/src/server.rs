//! The HTTP server behind `rollflash serve`: any Backend behind the SGLang-native and OpenAI-compatible APIs.
