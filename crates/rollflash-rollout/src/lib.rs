//! `rollflash-rollout`: the rollout plane. The [`Backend`] trait and its implementations (the
//! embedded engine, SGLang-native, OpenAI-compatible and vLLM HTTP servers, a Tinker server's
//! sampling API), the `LLMProxy` that queues, routes and replicates requests in front of them,
//! the HTTP server behind `rollflash serve`, and the `EnvManager` that runs one trajectory
//! through an environment.

pub mod backend;
pub mod engine_backend;
pub mod env_manager;
pub mod http;
pub mod instant;
pub mod proxy;
pub mod publish;
pub mod server;
pub mod timeline;
pub mod tinker_adapters;

pub use backend::{Backend, BackendError, BackendLoad, PauseMode, TokenScore, WeightUpdate};
pub use engine_backend::{adapted_model, EngineAdapterHost, EngineBackend, EngineBackendConfig};
pub use env_manager::{
    EnvFactory, EnvManager, EnvManagerConfig, FailureBackoff, GroupResult, Renderer,
};
pub use http::{
    probe_server, server_tokenize, ChatCompletion, HttpBackendConfig, OpenAiBackend, OpenAiConfig,
    ServerApi, ServerInfo, SglangBackend, TinkerBackend, TinkerBackendConfig, VllmBackend,
    VllmPause, WeightHook,
};
pub use instant::InstantBackend;
pub use proxy::{
    BackendEntry, BackendSync, LlmProxy, ProxyConfig, ProxyError, ProxyHandle, ProxyMetrics,
    Replication, SyncTimings, DEFAULT_REQUEST_TIMEOUT, DEFAULT_UPDATE_TIMEOUT,
};
pub use publish::{
    adapter_name, AdapterProbe, DiskWeights, Layout, PublishError, WeightPublisher, WeightRoute,
};
pub use server::{serve, AdapterHost, ServerConfig, ServerError, ServerState, WeightsAccess};
pub use timeline::Timeline;
pub use tinker_adapters::TinkerAdapters;
