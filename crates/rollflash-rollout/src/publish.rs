//! Weight publication to remote backends: the learner hands out in-process weights
//! (`WeightUpdate::InProcess`, which embedded engines take without a copy); a server in
//! another process can only load a directory. [`WeightPublisher`] writes each version once as
//! a Hugging Face directory (`v00000007/`: `config.json`, safetensors, tokenizer files), or,
//! for a LoRA model sent adapter-only, as a PEFT adapter directory (`adapter-v00000007/`:
//! `adapter_config.json`, `adapter_model.safetensors`), under one root — written to a
//! temporary name and renamed, so a server never sees half a version — and prunes all but the
//! newest few of each layout. A backend's [`WeightRoute`] (data on its proxy entry) says how
//! updates reach it: on the disk route ([`DiskWeights`]) an in-process update reaches the
//! server as `WeightUpdate::Disk` of the merged model (`W + (alpha/r)·B·A`), or, adapter-only,
//! as `WeightUpdate::Adapter`; every remote backend of a sync shares the one directory.
//!
//! The adapter route is never trusted blindly (a server that loads an adapter and samples
//! from the base would train a policy nobody samples from): after each adapter load a probe
//! generation runs on the server and its log-probs must match the trainer's adapted model
//! ([`AdapterProbe`]); a server failing it leaves rotation with the reason. A server that
//! refuses adapters (`Unsupported`) is sent merged weights from then on, with a warning.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rollflash_core::{GenRequest, Generated, IoError, PolicyVersion, RequestId};
use rollflash_model::config::ModelConfig;
use rollflash_model::model::Transformer;
use rollflash_model::tokenizer::Tokenizer;

use crate::backend::{Backend, BackendError, PauseMode, WeightUpdate};
use crate::tinker_adapters::TinkerAdapters;

/// A version could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Creating, clearing or renaming a directory under the root failed ([`PREPARE`]).
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("cannot write weights version {version} to {path}")]
    Save {
        version: PolicyVersion,
        path: PathBuf,
        #[source]
        source: rollflash_model::ModelError,
    },
    #[error("the task writing weights version {version} failed")]
    Task {
        version: PolicyVersion,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error("weights version {version} has no LoRA adapters to publish adapter-only")]
    NoAdapters { version: PolicyVersion },
}

/// What a failed directory operation of the publisher says it was doing (each error names
/// the directory after it).
const PREPARE: &str = "cannot prepare the weights directory";

/// How a version is laid out on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A whole Hugging Face model directory, adapters merged in.
    Merged,
    /// A PEFT adapter directory only (the server holds the base).
    Adapter,
}

/// Writes each published version as a Hugging Face directory under one root, once.
pub struct WeightPublisher {
    root: PathBuf,
    /// How many of the newest versions stay on disk (at least 1; 2 keeps the previous one
    /// while servers load the new one).
    keep: usize,
    model_cfg: ModelConfig,
    /// Saved beside the weights, so a server can load the directory as a whole model.
    tokenizer: Option<Arc<Tokenizer>>,
    /// The versions on disk, oldest first. A tokio `Mutex`, held while a version is written:
    /// the backends of one sync wait for the same directory instead of writing it twice.
    written: tokio::sync::Mutex<VecDeque<(PolicyVersion, Layout, PathBuf)>>,
}

impl std::fmt::Debug for WeightPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightPublisher")
            .field("root", &self.root)
            .field("keep", &self.keep)
            .finish()
    }
}

impl WeightPublisher {
    /// A publisher writing under `root` (created if missing, then made absolute: the paths
    /// sent to servers must not depend on their working directory), keeping the newest
    /// `keep` versions (at least one).
    pub fn new(
        root: impl Into<PathBuf>,
        keep: usize,
        model_cfg: ModelConfig,
        tokenizer: Option<Arc<Tokenizer>>,
    ) -> Result<Self, PublishError> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(IoError::at(PREPARE, &root))?;
        // Absolute: servers resolve a relative `model_path` against their own directory
        // (`rollflash serve` against its weights root), not the trainer's.
        let root = std::fs::canonicalize(&root).map_err(IoError::at(PREPARE, &root))?;
        Ok(WeightPublisher {
            root,
            keep: keep.max(1),
            model_cfg,
            tokenizer,
            written: tokio::sync::Mutex::new(VecDeque::new()),
        })
    }

    /// The root the versions are written under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory a version is published as.
    pub fn dir_of(&self, version: PolicyVersion) -> PathBuf {
        self.root.join(format!("v{:08}", version.0))
    }

    /// The directory a version's adapter is published as.
    pub fn adapter_dir_of(&self, version: PolicyVersion) -> PathBuf {
        self.root.join(format!("adapter-v{:08}", version.0))
    }

    /// The directory holding `model` as `version`: written now (to a temporary name, then
    /// renamed) unless this version already was, and older versions beyond `keep` removed.
    pub async fn publish(
        &self,
        model: &Transformer,
        version: PolicyVersion,
    ) -> Result<PathBuf, PublishError> {
        self.publish_as(model, version, Layout::Merged).await
    }

    /// The PEFT adapter directory of `model` (which must have adapters) as `version`, written
    /// as [`WeightPublisher::publish`] writes whole models; a few MB where the model is GBs.
    pub async fn publish_adapter(
        &self,
        model: &Transformer,
        version: PolicyVersion,
    ) -> Result<PathBuf, PublishError> {
        self.publish_as(model, version, Layout::Adapter).await
    }

    async fn publish_as(
        &self,
        model: &Transformer,
        version: PolicyVersion,
        layout: Layout,
    ) -> Result<PathBuf, PublishError> {
        let mut written = self.written.lock().await;
        if let Some((_, _, path)) = written
            .iter()
            .find(|(v, l, _)| *v == version && *l == layout)
        {
            return Ok(path.clone());
        }
        let (dir, tmp_name) = match layout {
            Layout::Merged => (self.dir_of(version), "v"),
            Layout::Adapter => (self.adapter_dir_of(version), "adapter-v"),
        };
        let tmp = self.root.join(format!(
            ".tmp-{tmp_name}{:08}-{}",
            version.0,
            std::process::id()
        ));
        let (cfg, tok) = (self.model_cfg.clone(), self.tokenizer.clone());
        let (tmp2, dir2, model) = (tmp.clone(), dir.clone(), model.clone());
        tokio::task::spawn_blocking(move || match layout {
            Layout::Merged => {
                // A server without the adapter route gets the adapters merged into the base.
                let weights = model
                    .merged_weights()
                    .map_err(|source| PublishError::Save {
                        version,
                        path: dir2.clone(),
                        source,
                    })?;
                write_dir(&tmp2, &dir2, |t| {
                    rollflash_model::hf::save_dir(t, &cfg, &weights, tok.as_deref()).map_err(
                        |source| PublishError::Save {
                            version,
                            path: t.to_path_buf(),
                            source,
                        },
                    )
                })
            }
            Layout::Adapter => {
                let adapters = model
                    .adapters()
                    .ok_or(PublishError::NoAdapters { version })?;
                write_dir(&tmp2, &dir2, |t| {
                    std::fs::create_dir_all(t).map_err(IoError::at(PREPARE, t))?;
                    // The base is whatever the server was started with; the name is only a
                    // label PEFT readers keep.
                    rollflash_model::lora::save_peft(t, adapters, "rollflash-base").map_err(
                        |source| PublishError::Save {
                            version,
                            path: t.to_path_buf(),
                            source,
                        },
                    )
                })
            }
        })
        .await
        .map_err(|source| PublishError::Task { version, source })??;
        written.push_back((version, layout, dir.clone()));
        // Prune per layout: a fallback from adapters to merged weights keeps the newest of
        // each.
        while written.iter().filter(|(_, l, _)| *l == layout).count() > self.keep {
            let Some(i) = written.iter().position(|(_, l, _)| *l == layout) else {
                break;
            };
            if let Some((old, _, path)) = written.remove(i) {
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::warn!(version = %old, path = %path.display(), error = %e, "cannot prune published weights");
                }
            }
        }
        Ok(dir)
    }
}

/// Saves into `tmp` with `save`, then renames it to `dir` (replacing a directory of the same
/// version left by an earlier process, e.g. before a resume).
fn write_dir(
    tmp: &Path,
    dir: &Path,
    save: impl FnOnce(&Path) -> Result<(), PublishError>,
) -> Result<(), PublishError> {
    if tmp.exists() {
        std::fs::remove_dir_all(tmp).map_err(IoError::at(PREPARE, tmp))?;
    }
    save(tmp)?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(IoError::at(PREPARE, dir))?;
    }
    Ok(std::fs::rename(tmp, dir).map_err(IoError::at(PREPARE, dir))?)
}

/// How weight updates reach one backend: data on its proxy entry
/// ([`crate::proxy::BackendEntry::route`]), which the proxy's one update call sends through
/// ([`WeightRoute::send`]); the backend itself only ever sees updates it can load.
pub enum WeightRoute {
    /// Every update goes to the backend as it is (in-process engines, a Tinker sampler).
    Direct,
    /// In-process versions written to disk for a remote server (merged or adapter-only), or a
    /// Tinker learner's versions fetched as the server's adapter.
    Disk(DiskWeights),
    /// The server keeps its own weights (`weights = "none"`: a frozen judge, a fixed-policy
    /// evaluation), declared to be version `serves`: an update to that version is accepted
    /// without loading anything, every other is refused, so after the first weight sync of a
    /// training run it leaves rotation rather than serve tokens of an older policy.
    Fixed { serves: PolicyVersion },
}

impl WeightRoute {
    /// The layout versions reach the server in on the disk route (`Merged` after a server
    /// refused adapters); `None` on the others.
    pub fn layout(&self) -> Option<Layout> {
        match self {
            WeightRoute::Disk(d) => Some(d.layout()),
            WeightRoute::Direct | WeightRoute::Fixed { .. } => None,
        }
    }

    /// Sends `update` to `backend` along this route.
    pub async fn send(
        &self,
        backend: &dyn Backend,
        update: &WeightUpdate,
    ) -> Result<(), BackendError> {
        match self {
            WeightRoute::Direct => backend.update_weights(update).await,
            WeightRoute::Disk(d) => d.send(backend, update).await,
            WeightRoute::Fixed { serves } if update.version() == *serves => Ok(()),
            WeightRoute::Fixed { .. } => Err(BackendError::Unsupported {
                backend: backend.name().to_string(),
                what: "weight updates (configured with weights = \"none\")".into(),
            }),
        }
    }
}

/// The disk route's state: in-process weights as a directory written by a shared
/// [`WeightPublisher`] (merged, or adapter-only with [`DiskWeights::adapter`]), or a Tinker
/// learner's adapters; every other update goes to the backend as it is.
pub struct DiskWeights {
    /// Where in-process versions are written (`None` on the Tinker route, which gets none).
    publisher: Option<Arc<WeightPublisher>>,
    /// The Tinker route: remote versions (`tinker://…`) arrive as the server's adapter.
    tinker: Option<Arc<TinkerAdapters>>,
    layout: Layout,
    /// Set when the server refused adapters: merged weights from then on.
    fell_back: AtomicBool,
    /// Set once the server is known to serve the base this run's adapters go on. Adapters
    /// alone never carry the base, and the server's need not be the trainer's: a warm-up
    /// trains the whole model before the adapters, a resumed run's checkpoint holds its own.
    base_checked: AtomicBool,
    probe: AdapterProbe,
}

impl DiskWeights {
    /// Merged weights, every version.
    pub fn new(publisher: Arc<WeightPublisher>) -> Self {
        DiskWeights {
            publisher: Some(publisher),
            tinker: None,
            layout: Layout::Merged,
            fell_back: AtomicBool::new(false),
            base_checked: AtomicBool::new(false),
            probe: AdapterProbe::default(),
        }
    }

    /// The adapter only, for a LoRA model and a server with runtime adapter routes: each
    /// load is checked by `probe`; a model without adapters, or a server that answers
    /// `Unsupported`, gets merged weights instead.
    pub fn adapter(publisher: Arc<WeightPublisher>, probe: AdapterProbe) -> Self {
        DiskWeights {
            layout: Layout::Adapter,
            probe,
            ..DiskWeights::new(publisher)
        }
    }

    /// The Tinker route: a version a Tinker learner saved (`WeightUpdate::Remote`) reaches
    /// this backend (not one of the server's samplers) as the server's PEFT adapter, fetched
    /// once per version by the shared `adapters` and checked by a probe against the server.
    pub fn tinker(adapters: Arc<TinkerAdapters>) -> Self {
        DiskWeights {
            publisher: None,
            tinker: Some(adapters),
            layout: Layout::Adapter,
            fell_back: AtomicBool::new(false),
            base_checked: AtomicBool::new(false),
            probe: AdapterProbe::default(),
        }
    }

    /// The layout versions reach this server in now (`Merged` after a fallback).
    pub fn layout(&self) -> Layout {
        if self.fell_back.load(Ordering::SeqCst) {
            Layout::Merged
        } else {
            self.layout
        }
    }

    fn publish_failed(backend: &dyn Backend, e: PublishError) -> BackendError {
        BackendError::Unavailable {
            backend: backend.name().to_string(),
            reason: "publishing the weights for it failed".into(),
            source: Some(Box::new(e)),
        }
    }

    fn publisher(&self) -> Result<&WeightPublisher, BackendError> {
        self.publisher
            .as_deref()
            .ok_or_else(|| BackendError::InvalidRequest {
                reason: "in-process weights on the Tinker route, whose learner is remote".into(),
                source: None,
            })
    }

    /// Loads a Tinker learner's version as its adapter and proves the backend serves it.
    async fn send_tinker(
        &self,
        backend: &dyn Backend,
        adapters: &TinkerAdapters,
        uri: &str,
        version: PolicyVersion,
    ) -> Result<(), BackendError> {
        let dir = adapters.fetch(uri, version).await?;
        backend
            .update_weights(&WeightUpdate::Adapter {
                dir,
                name: adapter_name(version),
                version,
            })
            .await?;
        // As on the publisher's adapter route: the probe needs the backend generating.
        backend.resume().await?;
        let checked = adapters.check(backend, uri, version).await;
        let repaused = backend.pause(PauseMode::Keep).await;
        checked?;
        repaused
    }

    async fn send_merged(
        &self,
        backend: &dyn Backend,
        model: &Transformer,
        version: PolicyVersion,
    ) -> Result<(), BackendError> {
        let path = self
            .publisher()?
            .publish(model, version)
            .await
            .map_err(|e| Self::publish_failed(backend, e))?;
        backend
            .update_weights(&WeightUpdate::Disk { path, version })
            .await
    }

    /// Publishes and loads the adapter, then proves the server applies it. `Ok(false)`: the
    /// server has no adapter routes (the caller falls back).
    async fn send_adapter(
        &self,
        backend: &dyn Backend,
        model: &Arc<Transformer>,
        version: PolicyVersion,
    ) -> Result<bool, BackendError> {
        if !self.base_checked.load(Ordering::SeqCst) {
            self.ensure_base(backend, model, version).await?;
            self.base_checked.store(true, Ordering::SeqCst);
        }
        let dir = self
            .publisher()?
            .publish_adapter(model, version)
            .await
            .map_err(|e| Self::publish_failed(backend, e))?;
        let update = WeightUpdate::Adapter {
            dir,
            name: adapter_name(version),
            version,
        };
        match backend.update_weights(&update).await {
            Ok(()) => {}
            Err(BackendError::Unsupported { what, .. }) => {
                tracing::warn!(
                    backend = %backend.name(),
                    %version,
                    "the server cannot load LoRA adapters ({what}): it is sent merged weights \
                     from now on"
                );
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        // The sync holds the backend paused; the probe needs it generating. In keep mode the
        // held requests go on meanwhile under the adapter each one names, which is the
        // version their tokens are labelled with.
        backend.resume().await?;
        let checked = self.probe.check(backend, model, version).await;
        let repaused = backend.pause(PauseMode::Keep).await;
        checked?;
        repaused.map(|()| true)
    }
}

impl DiskWeights {
    /// Makes the server serve the base `model`'s adapters go on: a probe of the base it
    /// serves now, and where that is not the trainer's, the base sent whole, once.
    async fn ensure_base(
        &self,
        backend: &dyn Backend,
        model: &Arc<Transformer>,
        version: PolicyVersion,
    ) -> Result<(), BackendError> {
        let base = Arc::new(base_of(backend, model)?);
        // As around the adapter's probe: the sync holds the backend paused.
        backend.resume().await?;
        let gap = self.probe.gap(backend, &base, version).await;
        let repaused = backend.pause(PauseMode::Keep).await;
        let gap = gap?;
        repaused?;
        if gap <= self.probe.tolerance {
            return Ok(());
        }
        tracing::info!(
            backend = %backend.name(),
            %version,
            gap,
            "the server's base model is not the trainer's (a warm-up or a checkpoint changed \
             it): it is sent whole once, adapters after it"
        );
        self.send_merged(backend, &base, version).await
    }
}

/// The name a version's adapter is loaded under on servers (`lora_name`, the `model` of
/// OpenAI requests): one per version, so a request names exactly the weights it runs under.
pub fn adapter_name(version: PolicyVersion) -> String {
    format!("rollflash-v{}", version.0)
}

/// Proves a server serves the adapter it loaded: a short generation of a fixed prompt at
/// temperature 1, whose log-probs must match the trainer's adapted model within `tolerance`.
/// Where the adapter changes those log-probs by more than the tolerance, a server that
/// samples from the base fails; where it does not (a fresh adapter, `B = 0`), the check is
/// passed vacuously (nothing can tell the two apart).
#[derive(Debug, Clone)]
pub struct AdapterProbe {
    /// Largest |served − trainer| allowed per token (both float32, same weights).
    pub tolerance: f32,
    /// Tokens generated by the probe.
    pub tokens: usize,
}

impl Default for AdapterProbe {
    fn default() -> Self {
        AdapterProbe {
            // vLLM's float32 CPU log-probs are within 5e-5 of the trainer's (the real-vLLM
            // test's measure); the embedded engine's within 1e-5. 1e-3 is that suite's bound.
            tolerance: 1e-3,
            tokens: 4,
        }
    }
}

/// Request ids of probes: counted down from the top, far from the proxy's ids, which count
/// up from 1.
static PROBE_IDS: AtomicU64 = AtomicU64::new(u64::MAX / 2);

/// A probe's generation on `backend`: a fixed prompt of ordinary token ids below `vocab`
/// (none special on the models we ship), then `tokens` new tokens at temperature 1, seeded
/// by the version; the prompt and what was served. Both adapter probes (the trainer's
/// model here, a Tinker server's) judge the served log-probs.
pub(crate) async fn probe_generation(
    backend: &dyn Backend,
    vocab: usize,
    tokens: usize,
    version: PolicyVersion,
) -> Result<(Vec<u32>, Generated), BackendError> {
    let vocab = vocab.max(1);
    let prompt: Vec<u32> = (0..8u32)
        .map(|i| ((i as usize * 37 + 11) % vocab) as u32)
        .collect();
    let req = GenRequest {
        id: RequestId(PROBE_IDS.fetch_sub(1, Ordering::Relaxed)),
        prompt: prompt.clone(),
        params: rollflash_core::SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: tokens.max(1),
            stop_token_ids: Vec::new(),
            seed: Some(version.0),
        },
        start_version: version,
        resume: None,
    };
    Ok((prompt, backend.generate(req).await?.output))
}

/// The trainer's log-probs of `tokens` after `prompt` under each of `models` (T = 1), on a
/// blocking thread.
async fn score(
    backend: &dyn Backend,
    models: Vec<Transformer>,
    prompt: &[u32],
    tokens: &[u32],
) -> Result<Vec<Vec<f32>>, BackendError> {
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(tokens);
    let p = prompt.len();
    tokio::task::spawn_blocking(move || {
        models
            .iter()
            .map(|m| {
                let st = rollflash_model::train::token_stats(m, &[&seq], 1.0, true)?;
                Ok(st.logprobs.to_vec1::<f32>()?[p..].to_vec())
            })
            .collect::<Result<Vec<_>, rollflash_model::ModelError>>()
    })
    .await
    .map_err(|e| BackendError::Unavailable {
        backend: backend.name().to_string(),
        reason: "the adapter probe's scoring task failed".into(),
        source: Some(Box::new(e)),
    })?
    .map_err(|e| BackendError::Unavailable {
        backend: backend.name().to_string(),
        reason: "the adapter probe could not score the served tokens".into(),
        source: Some(Box::new(e)),
    })
}

/// `model` without its adapters: the base they go on (the tensors are shared).
fn base_of(backend: &dyn Backend, model: &Transformer) -> Result<Transformer, BackendError> {
    Transformer::from_weights(
        model.config(),
        &model.weights(),
        model.dtype(),
        model.device(),
    )
    .map_err(|e| BackendError::Unavailable {
        backend: backend.name().to_string(),
        reason: "cannot build the base model for the adapter probe".into(),
        source: Some(Box::new(e)),
    })
}

/// Largest |served − trainer| over a probe's tokens.
fn max_gap(served: &[f32], trainer: &[f32]) -> f32 {
    served
        .iter()
        .zip(trainer)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

impl AdapterProbe {
    /// Largest |served − trainer's `model`| of a probe generation on `backend` as it is now
    /// (no adapter named); infinite when it generates nothing.
    async fn gap(
        &self,
        backend: &dyn Backend,
        model: &Arc<Transformer>,
        version: PolicyVersion,
    ) -> Result<f32, BackendError> {
        let (prompt, served) =
            probe_generation(backend, model.config().vocab_size, self.tokens, version).await?;
        if served.tokens.is_empty() {
            return Ok(f32::INFINITY);
        }
        let m = Transformer::clone(model);
        let lp = score(backend, vec![m], &prompt, &served.tokens).await?;
        Ok(max_gap(&served.logprobs, &lp[0]))
    }

    async fn check(
        &self,
        backend: &dyn Backend,
        model: &Arc<Transformer>,
        version: PolicyVersion,
    ) -> Result<(), BackendError> {
        let (prompt, served) =
            probe_generation(backend, model.config().vocab_size, self.tokens, version).await?;
        if served.tokens.is_empty() {
            return Err(self.failed(backend, version, "the probe generated no tokens".into()));
        }
        let base = base_of(backend, model)?;
        let lp = score(
            backend,
            vec![Transformer::clone(model), base],
            &prompt,
            &served.tokens,
        )
        .await?;
        let (to_adapted, to_base) = (
            max_gap(&served.logprobs, &lp[0]),
            max_gap(&served.logprobs, &lp[1]),
        );
        let bad_version = served.versions.iter().find(|v| **v != version);
        if let Some(v) = bad_version {
            return Err(self.failed(
                backend,
                version,
                format!("the probe's tokens are labelled version {v}"),
            ));
        }
        if to_adapted > self.tolerance {
            let why = if to_base <= self.tolerance {
                "it samples from the base model: the adapter is ignored"
            } else {
                "they match neither the adapted nor the base model"
            };
            return Err(self.failed(
                backend,
                version,
                format!(
                    "served log-probs differ from the trainer's adapted model by {to_adapted:.2e} \
                     (from the base model by {to_base:.2e}; tolerance {:.0e}): {why}",
                    self.tolerance
                ),
            ));
        }
        tracing::debug!(backend = %backend.name(), %version, to_adapted, to_base, "adapter probe passed");
        Ok(())
    }

    fn failed(&self, backend: &dyn Backend, version: PolicyVersion, why: String) -> BackendError {
        BackendError::Protocol {
            backend: backend.name().to_string(),
            reason: format!("adapter {} failed its probe: {why}", adapter_name(version)),
            source: None,
        }
    }
}

impl DiskWeights {
    /// Sends `update` to `backend`: in-process versions through the publisher (the adapter
    /// where the layout says so, falling back to merged weights for good where the server
    /// has no adapter routes), a Tinker learner's as the server's adapter.
    async fn send(&self, backend: &dyn Backend, update: &WeightUpdate) -> Result<(), BackendError> {
        match update {
            WeightUpdate::InProcess { model, version } => {
                if self.layout() == Layout::Adapter && model.adapters().is_some() {
                    match self.send_adapter(backend, model, *version).await {
                        Ok(true) => return Ok(()),
                        Ok(false) => self.fell_back.store(true, Ordering::SeqCst),
                        Err(e) => {
                            // The server may have lost its base meanwhile (restarted on its
                            // original model after a warm-up changed ours): the proxy's
                            // catch-up checks it again before the next adapter.
                            self.base_checked.store(false, Ordering::SeqCst);
                            return Err(e);
                        }
                    }
                }
                self.send_merged(backend, model, *version).await
            }
            WeightUpdate::Remote { uri, version } => match &self.tinker {
                Some(adapters) => self.send_tinker(backend, adapters, uri, *version).await,
                None => backend.update_weights(update).await,
            },
            WeightUpdate::Disk { .. } | WeightUpdate::Adapter { .. } => {
                backend.update_weights(update).await
            }
        }
    }
}
