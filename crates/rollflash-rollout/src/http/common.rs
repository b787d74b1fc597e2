//! What the HTTP client backends share beyond the connection: [`HttpCommon`] (the client,
//! the requests in flight, the version tokens get, the adapter bookkeeping and the parts of
//! `load` and `update_weights` every server's client writes the same way), [`ClientPause`]
//! (a pause held on the client side, for servers without a pause route) and [`finished`]
//! (the answer a `generate` call returns).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Mutex;

use rollflash_core::{FinishReason, GenOutput, GenRequest, Generated, PolicyVersion};
use serde_json::json;
use tokio::sync::watch;

use super::{HttpBackendConfig, HttpClient, KnownVersion, Registry, Ticket};
use crate::backend::{BackendError, BackendLoad, PauseMode, WeightUpdate};

/// Adapters kept loaded: the newest, and the one before it (requests sent just before a
/// switch still name it).
pub(crate) const ADAPTERS_KEPT: usize = 2;

/// The state and steps that the SGLang, vLLM and OpenAI clients share.
pub(crate) struct HttpCommon {
    /// The server, with the retries, timeouts and error mapping of its config.
    pub(crate) http: HttpClient,
    /// Requests in flight, for `abort`, `pause` and `load`.
    pub(crate) inflight: Registry,
    /// The version tokens get when the server does not report one.
    pub(crate) version: KnownVersion,
    /// The adapter calls name, and its version, once one was loaded.
    adapter: Mutex<Option<(String, PolicyVersion)>>,
    /// Adapters loaded through this backend, oldest first.
    adapters_loaded: tokio::sync::Mutex<VecDeque<String>>,
}

impl HttpCommon {
    /// The shared state of a client of the server at `cfg.base_url`; contacts nothing.
    pub(crate) fn new(cfg: &HttpBackendConfig) -> Result<Self, BackendError> {
        Ok(HttpCommon {
            http: HttpClient::new(cfg)?,
            inflight: Registry::default(),
            version: KnownVersion::new(cfg.initial_version),
            adapter: Mutex::new(None),
            adapters_loaded: tokio::sync::Mutex::new(VecDeque::new()),
        })
    }

    /// The backend's name: its base URL.
    pub(crate) fn name(&self) -> &str {
        self.http.name()
    }

    /// `Backend::load`: the requests in flight and the version they get.
    pub(crate) fn load(&self) -> BackendLoad {
        load_of(&self.inflight, self.version.get())
    }

    /// The adapter calls name now, with its version.
    pub(crate) fn current_adapter(&self) -> Option<(String, PolicyVersion)> {
        self.adapter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The preamble of `update_weights` for a server that loads whole weights from a
    /// directory: the directory and version of a `WeightUpdate::Disk`. Adapters are the
    /// caller's to take first; anything else is `Unsupported`.
    pub(crate) fn disk_update<'u>(
        &self,
        update: &'u WeightUpdate,
    ) -> Result<(&'u Path, PolicyVersion), BackendError> {
        match update {
            WeightUpdate::Disk { path, version } => Ok((path, *version)),
            _ => Err(BackendError::Unsupported {
                backend: self.name().to_string(),
                what: "in-process weight updates (write a checkpoint and send WeightUpdate::Disk)"
                    .into(),
            }),
        }
    }

    /// Whole weights of `version` are served now: calls name the base model again.
    pub(crate) fn weights_loaded(&self, version: PolicyVersion) {
        self.version.set(version);
        *self.adapter.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// A refusal of the adapter-loading `route`: no route (404), or one every version would
    /// get (400: LoRA off, rank too large) means the server does not do runtime adapters.
    pub(crate) fn adapter_refused(&self, route: &str, e: BackendError) -> BackendError {
        match e {
            BackendError::Unsupported { what, .. }
            | BackendError::InvalidRequest { reason: what, .. } => BackendError::Unsupported {
                backend: self.name().to_string(),
                what: format!("runtime LoRA adapters ({route}: {what})"),
            },
            e => e,
        }
    }

    /// The server holds adapter `name` of `version` (checked by the caller): calls name it
    /// from now on, and all but the newest [`ADAPTERS_KEPT`] are unloaded through
    /// `unload_route`.
    pub(crate) async fn adapter_loaded(
        &self,
        name: &str,
        version: PolicyVersion,
        unload_route: &str,
    ) {
        *self.adapter.lock().unwrap_or_else(|p| p.into_inner()) = Some((name.to_string(), version));
        self.version.set(version);
        let mut loaded = self.adapters_loaded.lock().await;
        if !loaded.iter().any(|n| n == name) {
            loaded.push_back(name.to_string());
        }
        while loaded.len() > ADAPTERS_KEPT {
            let Some(old) = loaded.pop_front() else { break };
            let body = json!({ "lora_name": old });
            // vLLM answers in plain text, SGLang in JSON.
            if let Err(e) = self.http.post_text_ok(unload_route, &body).await {
                // A leftover adapter costs server memory, not correctness: say so, go on.
                tracing::warn!(backend = %self.name(), adapter = %old, "cannot unload adapter: {e}");
            }
        }
    }
}

/// `Backend::load` from a registry of requests in flight and the version they get.
pub(crate) fn load_of(inflight: &Registry, version: PolicyVersion) -> BackendLoad {
    let (running, waiting) = inflight.counts();
    BackendLoad {
        running,
        waiting,
        version,
    }
}

/// What `generate` returns for `req`: its resumed part and what this call added in
/// `output`, ended by `finish`.
pub(crate) fn finished(req: &GenRequest, output: Generated, finish: FinishReason) -> GenOutput {
    GenOutput {
        id: req.id,
        prompt_len: req.prompt.len(),
        output,
        finish_reason: finish,
        start_version: req.start_version,
        served_by: Vec::new(),
    }
}

/// A pause held on the client side, for servers with no pause route (OpenAI, Tinker): new
/// calls wait while it holds, and a pause in `Abort` mode ends the running ones.
pub(crate) struct ClientPause(watch::Sender<bool>);

impl ClientPause {
    pub(crate) fn new() -> Self {
        ClientPause(watch::Sender::new(false))
    }

    /// `Backend::pause`. Paused first, so nothing starts between the aborts and the flag.
    pub(crate) fn pause(&self, mode: PauseMode, inflight: &Registry) {
        self.0.send_replace(true);
        if mode == PauseMode::Abort {
            inflight.abort_all();
        }
    }

    /// `Backend::resume`.
    pub(crate) fn resume(&self) {
        self.0.send_replace(false);
    }

    /// Waits while paused.
    pub(crate) async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // `wait_for` fails only when the sender is gone, and `self` holds it.
        let _ = rx.wait_for(|p| !*p).await;
    }

    /// Holds a registered request while paused, counted as waiting; `false` when it was
    /// aborted meanwhile (the caller returns what it has, as aborted).
    pub(crate) async fn admit(&self, ticket: &Ticket<'_>) -> bool {
        if !*self.0.borrow() {
            return true;
        }
        ticket.set_waiting(true);
        let admitted = tokio::select! {
            _ = self.wait() => true,
            _ = ticket.aborted() => false,
        };
        ticket.set_waiting(false);
        admitted
    }
}
