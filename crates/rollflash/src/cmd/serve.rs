//! `rollflash serve`: the embedded engine behind the SGLang-native and OpenAI-compatible HTTP
//! APIs (`rollflash_rollout::server`).
//!
//! Prints `listening on http://ADDR` as its first line on stdout once the port is bound (so
//! `--port 0` can be used by scripts and tests), logs to stderr, and stops gracefully on
//! Ctrl-C or SIGTERM: generations in flight are aborted and answered with their partial output.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use rollflash_core::PolicyVersion;
use rollflash_model::chat::ChatTemplate;
use rollflash_model::config::ModelConfig;
use rollflash_model::engine::EngineConfig;
use rollflash_model::model::Transformer;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;
use rollflash_rollout::{
    EngineAdapterHost, EngineBackend, EngineBackendConfig, ServerConfig, ServerState, WeightsAccess,
};

/// Arguments of `rollflash serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A Hugging Face model directory (config.json, *.safetensors, tokenizer.json). Default:
    /// the built-in model with random weights from --init-seed (fine for trying the API).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Seed of the built-in model's random weights (without --model).
    #[arg(long, default_value_t = 0)]
    init_seed: u64,
    /// Address to bind. The default accepts local connections only; binding a public address
    /// exposes generation (and, with --weights-root, weight loading) to the network: set
    /// --api-key then.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to bind; 0 picks a free one (see the first line printed).
    #[arg(long, default_value_t = 30000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health. Default: the
    /// ROLLFLASH_API_KEY environment variable, if set (safer than the command line, which
    /// other users can see).
    #[arg(long)]
    api_key: Option<ApiKey>,
    /// Name reported by /v1/models and expected in OpenAI requests. Default: the model
    /// directory's name, or `rollflash` for the built-in model.
    #[arg(long)]
    served_model_name: Option<String>,
    /// Sequences decoded together by the engine.
    #[arg(long, default_value_t = 64)]
    max_running_requests: usize,
    /// Prompt tokens prefilled per engine step.
    #[arg(long, default_value_t = 4096)]
    max_prefill_tokens: usize,
    /// CPU threads of the engine.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Allow POST /update_weights_from_disk to load checkpoint directories under DIR (after
    /// resolving symlinks and `..`). Without it (or the next flag) disk loads are refused.
    #[arg(long, value_name = "DIR")]
    weights_root: Option<PathBuf>,
    /// Allow POST /update_weights_from_disk to load any directory this process can read.
    /// Only for trusted, single-user setups.
    #[arg(long, conflicts_with = "weights_root")]
    allow_weights_from_anywhere: bool,
    /// Largest request body accepted (413 beyond).
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Policy version of the initial weights.
    #[arg(long, default_value_t = 0)]
    weight_version: u64,
    #[command(flatten)]
    placement: super::PlacementArgs,
}

/// An API key: `Debug` never shows it, so it cannot end up in logs.
#[derive(Clone)]
struct ApiKey(String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl FromStr for ApiKey {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err("the API key must not be empty".into());
        }
        Ok(ApiKey(s.to_string()))
    }
}

/// The model to serve with its text side.
struct Served {
    model: Transformer,
    tokenizer: Option<Tokenizer>,
    chat_template: Option<ChatTemplate>,
    eos: Vec<u32>,
    name: String,
}

fn load(a: &ServeArgs) -> Result<Served> {
    let placement = a.placement.open()?;
    let (device, dtype) = (placement.device, placement.dtype);
    match &a.model {
        Some(dir) => {
            let loaded = rollflash_model::hf::load_dir(dir, dtype, &device)
                .with_context(|| format!("loading model from {}", dir.display()))?;
            let eos = loaded.config.stop_tokens(loaded.tokenizer.as_ref());
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "rollflash".into());
            Ok(Served {
                model: loaded.model,
                tokenizer: loaded.tokenizer,
                chat_template: loaded.chat_template,
                eos,
                name,
            })
        }
        None => {
            let tokenizer = Tokenizer::builtin();
            let eos = tokenizer
                .eos_token_id()
                .context("the built-in tokenizer has no eos")?;
            let cfg = ModelConfig::builtin_default(tokenizer.vocab_size(), eos);
            let weights = Weights::random(&cfg, a.init_seed, dtype, &device)?;
            let model = Transformer::from_weights(&cfg, &weights, dtype, &device)?;
            Ok(Served {
                model,
                eos: cfg.stop_tokens(Some(&tokenizer)),
                tokenizer: Some(tokenizer),
                chat_template: Some(ChatTemplate::builtin()?),
                name: "rollflash".into(),
            })
        }
    }
}

pub fn run(a: ServeArgs) -> Result<()> {
    let weights = match (&a.weights_root, a.allow_weights_from_anywhere) {
        (Some(root), _) => WeightsAccess::Under(
            std::fs::canonicalize(root)
                .with_context(|| format!("--weights-root {}", root.display()))?,
        ),
        (None, true) => WeightsAccess::Anywhere,
        (None, false) => WeightsAccess::Disabled,
    };
    let api_key = match &a.api_key {
        Some(k) => Some(k.0.clone()),
        None => std::env::var("ROLLFLASH_API_KEY")
            .ok()
            .filter(|k| !k.is_empty()),
    };
    let served = load(&a)?;
    let version = PolicyVersion(a.weight_version);
    let vocab_size = served.model.config().vocab_size;
    let engine_cfg = EngineBackendConfig {
        name: "engine-0".into(),
        engine: EngineConfig {
            max_running_requests: a.max_running_requests,
            max_prefill_tokens: a.max_prefill_tokens,
            threads: a.threads,
        },
    };
    let backend = Arc::new(EngineBackend::start(
        Arc::new(served.model),
        version,
        engine_cfg.clone(),
    )?);
    // LoRA adapters loaded at run time each get an engine on the base's weights.
    let adapters = EngineAdapterHost::new(Arc::clone(&backend), engine_cfg);
    let state = ServerState {
        adapters: Some(Arc::new(adapters)),
        backend,
        tokenizer: served.tokenizer,
        chat_template: served.chat_template,
        config: ServerConfig {
            model_name: a.served_model_name.clone().unwrap_or(served.name),
            api_key,
            max_body_bytes: a.max_body_bytes,
            weights,
            eos_token_ids: served.eos,
            vocab_size: Some(vocab_size),
            ..ServerConfig::default()
        },
    };
    if a.host != "127.0.0.1"
        && a.host != "localhost"
        && a.host != "::1"
        && state.config.api_key.is_none()
    {
        tracing::warn!(host = %a.host, "serving beyond loopback without an API key");
    }
    // The engine has its own threads; the runtime only moves bytes.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("binding {}:{}", a.host, a.port))?;
        let addr: SocketAddr = listener.local_addr()?;
        // Handlers first: a client may signal as soon as it reads the address.
        let shutdown = crate::signal::shutdown_signal();
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "listening on http://{addr}")?;
            out.flush()?;
        }
        tracing::info!(
            model = %state.config.model_name,
            %version,
            weights = ?state.config.weights,
            auth = state.config.api_key.is_some(),
            "rollflash serve"
        );
        rollflash_rollout::serve(listener, state, shutdown).await?;
        tracing::info!("stopped");
        Ok(())
    })
}
