//! Weight publication to remote backends: the learner hands out in-process weights
//! (`WeightUpdate::InProcess`, which embedded engines take without a copy); a server in
//! another process can only load a directory. [`WeightPublisher`] writes each version once as
//! a Hugging Face directory (`v00000007/`: `config.json`, safetensors, tokenizer files) under
//! one root — written to a temporary name and renamed, so a server never sees half a
//! checkpoint — and prunes all but the newest few. A model with LoRA adapters is written
//! merged (`W + (alpha/r)·B·A`), since a server loads plain weights. [`DiskWeights`] wraps a remote backend so
//! that an in-process update reaches it as `WeightUpdate::Disk` of that directory; every
//! remote backend of a sync shares the one directory.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use rollflash_core::{GenOutput, GenRequest, Generated, PolicyVersion, RequestId};
use rollflash_model::config::ModelConfig;
use rollflash_model::model::Transformer;
use rollflash_model::tokenizer::Tokenizer;

use crate::backend::{Backend, BackendError, BackendLoad, PauseMode, TokenScore, WeightUpdate};

/// A version could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot prepare the weights directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write weights version {version} to {path}: {source}")]
    Save {
        version: PolicyVersion,
        path: PathBuf,
        #[source]
        source: rollflash_model::ModelError,
    },
    #[error("the task writing weights version {version} failed: {source}")]
    Task {
        version: PolicyVersion,
        #[source]
        source: tokio::task::JoinError,
    },
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
    written: tokio::sync::Mutex<VecDeque<(PolicyVersion, PathBuf)>>,
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
        let io = |source| PublishError::Io {
            path: root.clone(),
            source,
        };
        std::fs::create_dir_all(&root).map_err(io)?;
        // Absolute: servers resolve a relative `model_path` against their own directory
        // (`rollflash serve` against its weights root), not the trainer's.
        let root = std::fs::canonicalize(&root).map_err(io)?;
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

    /// The directory holding `model` as `version`: written now (to a temporary name, then
    /// renamed) unless this version already was, and older versions beyond `keep` removed.
    pub async fn publish(
        &self,
        model: &Transformer,
        version: PolicyVersion,
    ) -> Result<PathBuf, PublishError> {
        let mut written = self.written.lock().await;
        if let Some((_, path)) = written.iter().find(|(v, _)| *v == version) {
            return Ok(path.clone());
        }
        let dir = self.dir_of(version);
        let tmp = self
            .root
            .join(format!(".tmp-v{:08}-{}", version.0, std::process::id()));
        let (cfg, tok) = (self.model_cfg.clone(), self.tokenizer.clone());
        let (tmp2, dir2, model) = (tmp.clone(), dir.clone(), model.clone());
        tokio::task::spawn_blocking(move || {
            // A server knows nothing of LoRA: it gets the adapters merged into the base.
            let weights = model
                .merged_weights()
                .map_err(|source| PublishError::Save {
                    version,
                    path: dir2.clone(),
                    source,
                })?;
            write_dir(&tmp2, &dir2, &cfg, &weights, tok, version)
        })
        .await
        .map_err(|source| PublishError::Task { version, source })??;
        written.push_back((version, dir.clone()));
        while written.len() > self.keep {
            if let Some((old, path)) = written.pop_front() {
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::warn!(version = %old, path = %path.display(), error = %e, "cannot prune published weights");
                }
            }
        }
        Ok(dir)
    }
}

/// Saves into `tmp`, then renames it to `dir` (replacing a directory of the same version left
/// by an earlier process, e.g. before a resume).
fn write_dir(
    tmp: &Path,
    dir: &Path,
    cfg: &ModelConfig,
    weights: &rollflash_model::weights::Weights,
    tokenizer: Option<Arc<Tokenizer>>,
    version: PolicyVersion,
) -> Result<(), PublishError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PublishError::Io { path, source }
    };
    if tmp.exists() {
        std::fs::remove_dir_all(tmp).map_err(io(tmp))?;
    }
    rollflash_model::hf::save_dir(tmp, cfg, weights, tokenizer.as_deref()).map_err(|source| {
        PublishError::Save {
            version,
            path: tmp.to_path_buf(),
            source,
        }
    })?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io(dir))?;
    }
    std::fs::rename(tmp, dir).map_err(io(dir))
}

/// A remote backend that receives in-process weights as a directory written by a shared
/// [`WeightPublisher`]; everything else goes straight to the backend it wraps.
pub struct DiskWeights {
    inner: Arc<dyn Backend>,
    publisher: Arc<WeightPublisher>,
}

impl DiskWeights {
    pub fn new(inner: Arc<dyn Backend>, publisher: Arc<WeightPublisher>) -> Self {
        DiskWeights { inner, publisher }
    }
}

#[async_trait]
impl Backend for DiskWeights {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        self.inner.generate(req).await
    }
    async fn generate_stream(
        &self,
        req: GenRequest,
        tokens: tokio::sync::mpsc::UnboundedSender<Generated>,
    ) -> Result<GenOutput, BackendError> {
        self.inner.generate_stream(req, tokens).await
    }
    async fn score(
        &self,
        tokens: &[u32],
        temperature: f64,
        top: usize,
    ) -> Result<Vec<TokenScore>, BackendError> {
        self.inner.score(tokens, temperature, top).await
    }
    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        self.inner.abort(id).await
    }
    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        self.inner.pause(mode).await
    }
    async fn resume(&self) -> Result<(), BackendError> {
        self.inner.resume().await
    }
    async fn update_weights(&self, update: &WeightUpdate) -> Result<(), BackendError> {
        match update {
            WeightUpdate::InProcess { model, version } => {
                let path = self.publisher.publish(model, *version).await.map_err(|e| {
                    BackendError::Unavailable {
                        backend: self.inner.name().to_string(),
                        reason: "publishing the weights for it failed".into(),
                        source: Some(Box::new(e)),
                    }
                })?;
                let disk = WeightUpdate::Disk {
                    path,
                    version: *version,
                };
                self.inner.update_weights(&disk).await
            }
            WeightUpdate::Disk { .. } | WeightUpdate::Remote { .. } => {
                self.inner.update_weights(update).await
            }
        }
    }
    async fn load(&self) -> Result<BackendLoad, BackendError> {
        self.inner.load().await
    }
    async fn health(&self) -> Result<(), BackendError> {
        self.inner.health().await
    }
}

/// A remote backend that keeps its own weights (`weights = "none"`: a frozen judge, a
/// fixed-policy evaluation), declared to be version `serves`: an update to that version is
/// accepted without loading anything, every other is refused, so after the first weight sync
/// of a training run it leaves rotation rather than serve tokens of an older policy.
pub struct FixedWeights {
    inner: Arc<dyn Backend>,
    serves: PolicyVersion,
}

impl FixedWeights {
    pub fn new(inner: Arc<dyn Backend>, serves: PolicyVersion) -> Self {
        FixedWeights { inner, serves }
    }
}

#[async_trait]
impl Backend for FixedWeights {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        self.inner.generate(req).await
    }
    async fn generate_stream(
        &self,
        req: GenRequest,
        tokens: tokio::sync::mpsc::UnboundedSender<Generated>,
    ) -> Result<GenOutput, BackendError> {
        self.inner.generate_stream(req, tokens).await
    }
    async fn score(
        &self,
        tokens: &[u32],
        temperature: f64,
        top: usize,
    ) -> Result<Vec<TokenScore>, BackendError> {
        self.inner.score(tokens, temperature, top).await
    }
    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        self.inner.abort(id).await
    }
    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        self.inner.pause(mode).await
    }
    async fn resume(&self) -> Result<(), BackendError> {
        self.inner.resume().await
    }
    async fn update_weights(&self, update: &WeightUpdate) -> Result<(), BackendError> {
        if update.version() == self.serves {
            return Ok(());
        }
        Err(BackendError::Unsupported {
            backend: self.inner.name().to_string(),
            what: "weight updates (configured with weights = \"none\")".into(),
        })
    }
    async fn load(&self) -> Result<BackendLoad, BackendError> {
        self.inner.load().await
    }
    async fn health(&self) -> Result<(), BackendError> {
        self.inner.health().await
    }
}
