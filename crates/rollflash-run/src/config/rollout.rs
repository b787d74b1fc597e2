//! `[rollout]`: generation and the environment loop, and the rollout servers in other
//! processes (`[[rollout.servers]]`) with how each receives new weights.

use std::path::PathBuf;

use rollflash_core::proxy::Routing;
use serde::{Deserialize, Serialize};

use super::check::{check_key, check_timeout, check_url, resolve_api_key};
use super::{field, ConfigError, RendererChoice};

/// Generation and environment loop settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutSection {
    /// Embedded engine workers.
    pub engines: usize,
    /// CPU threads per engine worker: a number, or `"auto"` (default: the machine's cores
    /// shared among the engines; `crate::cores` says why).
    pub engine_threads: super::Threads,
    /// Admission limit per engine.
    pub max_running_requests: usize,
    /// `round_robin`, `least_loaded` or `sticky`.
    pub routing: Routing,
    pub temperature: f64,
    pub top_p: f64,
    /// Tokens per model turn.
    pub max_new_tokens: usize,
    pub max_turns: usize,
    /// Budget of one trajectory's whole token sequence.
    pub max_total_tokens: usize,
    /// Bound on one environment `reset`/`step`.
    pub step_timeout_secs: f64,
    /// Bound on one generation attempt on a backend: past it the attempt is cancelled and
    /// retried on another backend, then failed (and counted) once the retries are spent.
    pub request_timeout_secs: f64,
    /// Extra trajectories per group; the first `group_size` to finish are kept.
    pub group_size_redundancy: usize,
    /// How conversations become tokens: `auto` (the model directory's chat template when it
    /// has one, else plain text), `plain`, or `chat`.
    pub renderer: RendererChoice,
    /// Rollout servers in other processes (`[[rollout.servers]]`), beside the `engines`
    /// embedded ones (which may then be 0); all go behind one proxy.
    pub servers: Vec<ServerSection>,
    /// Where the learner publishes each version for servers with `weights = "disk"` (one
    /// Hugging Face directory per version, the newest two kept). Default:
    /// `<output_dir>/published`. Servers must be able to read it (same machine, or a shared
    /// file system mounted at the same path).
    pub weights_dir: Option<PathBuf>,
    /// Bound on one backend's weight update in a sync: past it the backend leaves rotation
    /// and the sync goes on with the others.
    pub weight_sync_timeout_secs: f64,
    /// Bound on each start-up check of a server (health, model, vocabulary) and on its first
    /// weight load.
    pub server_check_timeout_secs: f64,
}

impl Default for RolloutSection {
    fn default() -> Self {
        RolloutSection {
            engines: 1,
            engine_threads: super::Threads::Auto,
            max_running_requests: 64,
            routing: Routing::LeastLoaded,
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 64,
            max_turns: 1,
            max_total_tokens: 128,
            step_timeout_secs: 30.0,
            request_timeout_secs: rollflash_rollout::DEFAULT_REQUEST_TIMEOUT.as_secs_f64(),
            group_size_redundancy: 0,
            renderer: RendererChoice::Auto,
            servers: Vec::new(),
            weights_dir: None,
            weight_sync_timeout_secs: rollflash_rollout::DEFAULT_UPDATE_TIMEOUT.as_secs_f64(),
            server_check_timeout_secs: 30.0,
        }
    }
}

/// One rollout server (`[[rollout.servers]]`).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Which API it speaks: `sglang`, `vllm`, `openai` or `rollflash` (`rollflash serve`).
    pub kind: ServerKind,
    /// Its root, e.g. `http://10.0.0.5:30000` (`http://` only).
    pub url: String,
    /// The API key, sent as `Authorization: Bearer`. Never printed (`--dry-run` leaves it
    /// out); prefer `api_key_env`.
    #[serde(default, skip_serializing)]
    pub api_key: Option<String>,
    /// The environment variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// At most this many requests run on it at once; the rest wait in the proxy's queue.
    #[serde(default = "default_server_running")]
    pub max_running_requests: usize,
    /// How it receives new weights: `disk` (loads each published directory) or `none` (keeps
    /// its own: a frozen judge or a fixed-policy evaluation; in a training run it leaves
    /// rotation at the first weight sync).
    #[serde(default)]
    pub weights: ServerWeights,
    /// The `model` sent to an OpenAI-compatible server; default: the first of `/v1/models`.
    #[serde(default)]
    pub model: Option<String>,
    /// Bound on one HTTP call to it, a whole generation included (default 600).
    #[serde(default)]
    pub timeout_secs: Option<f64>,
    /// Bound on opening a connection to it (default 5).
    #[serde(default)]
    pub connect_timeout_secs: Option<f64>,
    /// Bound on one weight update of this server, its pause and resume included (default
    /// `rollout.weight_sync_timeout_secs`): a server whose reload is slow gets more time
    /// without the others' hung updates being waited on as long. Each HTTP call of the
    /// update is also bounded by `timeout_secs`.
    #[serde(default)]
    pub weight_sync_timeout_secs: Option<f64>,
}

impl std::fmt::Debug for ServerSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSection")
            .field("kind", &self.kind)
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("api_key_env", &self.api_key_env)
            .field("max_running_requests", &self.max_running_requests)
            .field("weights", &self.weights)
            .field("model", &self.model)
            .field("timeout_secs", &self.timeout_secs)
            .field("connect_timeout_secs", &self.connect_timeout_secs)
            .field("weight_sync_timeout_secs", &self.weight_sync_timeout_secs)
            .finish()
    }
}

fn default_server_running() -> usize {
    64
}

/// The API a rollout server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// SGLang's native API (`/generate` with token ids, `/update_weights_from_disk`).
    Sglang,
    /// vLLM's OpenAI server with its RL routes.
    Vllm,
    /// Any OpenAI-compatible server (`/v1/completions` with token ids); `weights = "disk"`
    /// posts SGLang's `/update_weights_from_disk`, which `rollflash serve` has.
    Openai,
    /// `rollflash serve` (its SGLang-native API, with per-token versions).
    Rollflash,
    /// A Tinker server's sampler (`asample`): the rollout side of `learner.kind = "tinker"`.
    Tinker,
}

/// How a rollout server receives new weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerWeights {
    /// It loads each version the learner publishes under `rollout.weights_dir`: with
    /// `[train.lora]` and a server with runtime LoRA routes (`vllm`, `sglang`, `rollflash`),
    /// the adapter only (a PEFT directory, checked by a probe after each load); otherwise the
    /// merged model.
    #[default]
    Disk,
    /// As `disk`, but always the whole merged model (adapter-only sync off).
    Merged,
    /// It keeps the weights it was started with.
    None,
}

impl ServerWeights {
    /// Whether a server of `kind` with these settings is sent adapters only: the one place
    /// the adapter route is decided.
    pub fn sends_adapter(self, kind: ServerKind, lora: bool) -> bool {
        lora && self == ServerWeights::Disk
            && matches!(
                kind,
                ServerKind::Vllm | ServerKind::Sglang | ServerKind::Rollflash
            )
    }
}

impl ServerSection {
    pub(super) fn validate(&self, i: usize) -> Result<(), ConfigError> {
        let section = format!("rollout.servers[{i}]");
        let name = |f: &str| format!("{section}.{f}");
        check_url(&name("url"), &self.url)?;
        if self.max_running_requests == 0 {
            return Err(field(&name("max_running_requests"), "must be at least 1"));
        }
        check_key(&section, &self.api_key, &self.api_key_env)?;
        // A server's key is needed at start-up: an unset variable is named at load.
        resolve_api_key(&section, &self.api_key, &self.api_key_env)?;
        for (f, v) in [
            ("timeout_secs", self.timeout_secs),
            ("connect_timeout_secs", self.connect_timeout_secs),
            ("weight_sync_timeout_secs", self.weight_sync_timeout_secs),
        ] {
            if let Some(v) = v {
                check_timeout(&name(f), v)?;
            }
        }
        Ok(())
    }
}
