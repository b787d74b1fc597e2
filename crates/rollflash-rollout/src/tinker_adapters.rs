//! Adapters a Tinker server trained, for backends that are not its samplers: each version's
//! `tinker://…/sampler_weights/…` path ([`WeightUpdate::Remote`]) is downloaded once as the
//! server's archive of the PEFT adapter and unpacked under one root, shared by every such
//! backend of a sync (an embedded engine, vLLM, SGLang, `rollflash serve`), which then loads
//! it as [`WeightUpdate::Adapter`] ([`crate::publish::DiskWeights::tinker`]).
//!
//! As on the adapter route of an embedded learner, a loaded adapter is not trusted blindly:
//! a probe generation on the backend must have the log-probs the Tinker server gives the
//! same tokens under the same weights ([`TinkerAdapters::check`]), so a backend serving its
//! base model, or a base model other than the server's, leaves rotation with the reason.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::Duration;

use rollflash_core::PolicyVersion;
use rollflash_tinker::{
    unpack_adapter, Heartbeat, SamplerPath, SamplerSource, SamplingParams, TinkerClient,
};
use tokio::sync::Mutex;

use crate::backend::{Backend, BackendError};
use crate::publish::probe_generation;

/// The adapters of one Tinker training run, as directories.
pub struct TinkerAdapters {
    client: TinkerClient,
    root: PathBuf,
    keep: usize,
    /// The vocabulary the probe's prompt is drawn from.
    vocab: usize,
    /// Largest |served − server| log-prob allowed per probe token.
    tolerance: f32,
    /// Versions unpacked, oldest first; the lock also makes one download per version.
    fetched: Mutex<VecDeque<(PolicyVersion, PathBuf)>>,
    /// The probes' session on the server, opened at the first probe and kept alive.
    session: Mutex<Option<(String, Heartbeat)>>,
    sampling_seq: AtomicU32,
    sample_seq: AtomicI32,
}

impl std::fmt::Debug for TinkerAdapters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinkerAdapters")
            .field("server", &self.client.config().base_url)
            .field("root", &self.root)
            .finish()
    }
}

impl TinkerAdapters {
    /// Adapters from the server `client` talks to, unpacked under `root` (the newest `keep`
    /// kept); probes draw prompt tokens below `vocab`.
    pub fn new(client: TinkerClient, root: PathBuf, keep: usize, vocab: usize) -> TinkerAdapters {
        TinkerAdapters {
            client,
            root,
            keep: keep.max(1),
            vocab: vocab.max(2),
            // The server computes in float32 with JAX, an engine in float32 with other
            // kernels: measured within 1e-4 on the test model; 2e-3 is still far below what
            // an adapter that moved the policy at all changes.
            tolerance: 2e-3,
            fetched: Mutex::new(VecDeque::new()),
            session: Mutex::new(None),
            sampling_seq: AtomicU32::new(0),
            sample_seq: AtomicI32::new(0),
        }
    }

    /// The server the adapters come from.
    pub fn server(&self) -> &str {
        &self.client.config().base_url
    }

    fn failed(&self, uri: &str, reason: String, source: Option<BoxError>) -> BackendError {
        BackendError::Unavailable {
            backend: format!("Tinker server {}", self.server()),
            reason: format!("cannot fetch the adapter {uri}: {reason}"),
            source,
        }
    }

    /// The directory holding `uri`'s adapter (version `version`), downloading and unpacking
    /// it unless an earlier backend of the sync already did.
    pub async fn fetch(&self, uri: &str, version: PolicyVersion) -> Result<PathBuf, BackendError> {
        let mut fetched = self.fetched.lock().await;
        if let Some((_, dir)) = fetched.iter().find(|(v, _)| *v == version) {
            return Ok(dir.clone());
        }
        let path = SamplerPath::parse(uri).ok_or_else(|| {
            self.failed(
                uri,
                "not a tinker://<model>/sampler_weights/<name> path".into(),
                None,
            )
        })?;
        let archive = self
            .client
            .sampler_archive(&path)
            .await
            .map_err(|e| self.failed(uri, "the download failed".into(), Some(Box::new(e))))?;
        let dir = self.root.join(format!("tinker-adapter-v{:08}", version.0));
        let tmp = self
            .root
            .join(format!(".tinker-adapter-v{:08}.tmp", version.0));
        let (d, t) = (dir.clone(), tmp.clone());
        // Unpacking writes files: off the async runtime. A half-written directory never
        // carries the version's name.
        tokio::task::spawn_blocking(move || -> Result<(), BoxError> {
            for p in [&t, &d] {
                if p.exists() {
                    std::fs::remove_dir_all(p)?;
                }
            }
            unpack_adapter(&archive, &t)?;
            std::fs::rename(&t, &d)?;
            Ok(())
        })
        .await
        .map_err(|e| self.failed(uri, "the unpacking task failed".into(), Some(Box::new(e))))?
        .map_err(|e| self.failed(uri, format!("unpacking into {}", dir.display()), Some(e)))?;
        fetched.push_back((version, dir.clone()));
        while fetched.len() > self.keep {
            if let Some((_, old)) = fetched.pop_front() {
                // A backend still loading an older version has read it by the next sync.
                let _ = std::fs::remove_dir_all(old);
            }
        }
        Ok(dir)
    }

    /// Proves `backend` serves `uri`'s weights: a short generation at temperature 1 from a
    /// fixed prompt, whose tokens the server then scores under the same weights; every
    /// token's log-prob must agree within the tolerance.
    pub async fn check(
        &self,
        backend: &dyn Backend,
        uri: &str,
        version: PolicyVersion,
    ) -> Result<(), BackendError> {
        let (prompt, served) = probe_generation(backend, self.vocab, 4, version).await?;
        let bad = |why: String| BackendError::Protocol {
            backend: backend.name().to_string(),
            reason: format!("the Tinker adapter of version {version} failed its probe: {why}"),
            source: None,
        };
        if served.tokens.is_empty() {
            return Err(bad("the probe generated no tokens".into()));
        }
        if let Some(v) = served.versions.iter().find(|v| **v != version) {
            return Err(bad(format!("the probe's tokens are labelled version {v}")));
        }
        let mut seq: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        seq.extend(served.tokens.iter().map(|&t| t as i32));
        let reference = self
            .server_logprobs(uri, &seq)
            .await
            .map_err(|e| self.failed(uri, "scoring the probe on the server".into(), Some(e)))?;
        let p = prompt.len();
        let mut worst = 0f32;
        for (k, lp) in served.logprobs.iter().enumerate() {
            let Some(Some(r)) = reference.get(p + k) else {
                return Err(bad(format!(
                    "the server gave no log-prob for probe token {k}"
                )));
            };
            worst = worst.max((lp - r).abs());
        }
        if !(worst <= self.tolerance) {
            return Err(bad(format!(
                "served log-probs differ from the Tinker server's by {worst:.2e} (tolerance \
                 {:.0e}): the backend does not serve what the server trained (its base model \
                 differs, or it ignores the adapter)",
                self.tolerance
            )));
        }
        tracing::debug!(backend = %backend.name(), %version, worst, "Tinker adapter probe passed");
        Ok(())
    }

    /// The server's log-prob of each token of `seq` under `uri`'s weights (the first `None`).
    async fn server_logprobs(&self, uri: &str, seq: &[i32]) -> Result<Vec<Option<f32>>, BoxError> {
        let session = self.session().await?;
        let sampler = self
            .client
            .create_sampling_session(
                &session,
                self.sampling_seq.fetch_add(1, Ordering::Relaxed),
                SamplerSource::ModelPath(uri),
            )
            .await?;
        let params = SamplingParams {
            max_tokens: 1,
            seed: Some(0),
            stop: Vec::new(),
            temperature: 1.0,
            top_k: -1,
            top_p: 1.0,
        };
        let out = self
            .client
            .sample(
                &sampler,
                self.sample_seq.fetch_add(1, Ordering::Relaxed),
                seq,
                1,
                params,
                true,
            )
            .await?;
        out.prompt_logprobs
            .ok_or_else(|| "the server returned no prompt log-probs".into())
    }

    async fn session(&self) -> Result<String, BoxError> {
        let mut s = self.session.lock().await;
        if let Some((id, _)) = s.as_ref() {
            return Ok(id.clone());
        }
        let id = self
            .client
            .create_session(vec!["rollflash-adapter-probe".into()])
            .await?;
        let beat = Heartbeat::spawn(
            self.client.counted_apart(),
            id.clone(),
            Duration::from_secs(60),
        );
        *s = Some((id.clone(), beat));
        Ok(id)
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
