//! [`TinkerBackend`]: the sampling side of a Tinker server (hosted Tinker, SkyRL, TuFT, …) as a
//! [`Backend`], through `rollflash_tinker::TinkerClient`.
//!
//! It owns one Tinker session (kept alive by an owned heartbeat task, stopped when the
//! backend drops) and one current sampling session: the base model as the initial version,
//! then, after each [`WeightUpdate::Remote`], a session on that `tinker://` sampler path.
//!
//! What is sent per request (`asample`): the prompt then any resumed tokens as one encoded-text
//! chunk, `num_samples: 1`, `max_tokens` = what is left of `max_new_tokens`, `temperature`,
//! `top_p`, `top_k` (-1 = off), the stop token ids, and the request's seed
//! ([`super::request_seed`], moved on by the resumed length as `VllmBackend` does, so a resumed
//! attempt does not replay the random stream; folded into 31 bits, the range SkyRL draws its own
//! seeds from: its JAX sampler turns seeds into 32-bit keys). What is read back: the tokens,
//! one log-prob each, and the stop reason; each token gets the version of the sampling session
//! the request was submitted to. Replies are validated (one sequence; one finite log-prob per
//! token; no more tokens than asked; ids within the vocabulary when it is known; a `stop`
//! ending on a stop token) and anything else is [`BackendError::Protocol`].
//!
//! Log-probs: SkyRL's JAX sampler reports `log_softmax(logits)` of the sampled token — the
//! temperature-1, unfiltered distribution — whatever `temperature`, `top_k` and `top_p` were
//! used to draw it. At temperature 1 without top-k/top-p that is the behaviour log-prob;
//! otherwise it is not, and a learner that corrects for the behaviour policy must know.
//!
//! Weights: `update_weights(Remote { uri, version })` opens a new sampling session on `uri`,
//! samples one token from it (SkyRL checks the checkpoint only when it is first sampled, and
//! loads it then: the probe makes a wrong path an error of the update and moves the load into
//! the sync), then swaps it in. Requests already submitted finish on the old session and
//! report the old version; later ones use the new. Other updates are refused: a Tinker server
//! holds its own weights.
//!
//! Restarts: SkyRL keeps its sessions and sampling sessions in its database but its models
//! in the engine's memory, so after a restart this backend is healthy (its session is still
//! there) while samples from a trained checkpoint fail (`Model … not loaded`) until a trainer
//! re-creates the model from its saved state and publishes sampler weights again. Such
//! failures are `Unavailable` (see [`map_error`]), so the proxy takes the backend out of
//! rotation and its probe brings it back with the next weights that load.
//!
//! The protocol has no abort and no pause, so both are client-side:
//! - `abort(id)` drops our wait for the request's future and returns it with
//!   `FinishReason::Aborted` and no new tokens (a sample comes back whole or not at all);
//! - `pause(Abort)` does that to every request in flight and holds new ones until `resume`;
//!   `pause(Keep)` lets requests in flight finish (on the session they started on) and holds
//!   new ones.
//!
//! What a stale request costs: the server does not learn that it was aborted. It samples it to
//! the end (its `max_tokens` or a stop token), holding a slot of its sampling batch (SkyRL:
//! `sample_max_num_sequences`) and delaying whatever queues behind it; the result is never
//! fetched. The attempt's tokens are lost too: the proxy resumes an aborted request from what
//! it returned, which here is only what earlier attempts had. So on Tinker `pause(Keep)` is
//! the cheap mode for a weight sync: nothing is wasted, and the old-version tokens are bounded
//! by the controller's staleness limit like any others.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use rollflash_core::{FinishReason, GenOutput, GenRequest, Generated, PolicyVersion, RequestId};
use rollflash_tinker::{
    ClientConfig, Heartbeat, RetryPolicy, SampleOutput, SamplerSource, StopReason, TinkerClient,
    TinkerError,
};

use super::common::{finished, load_of, ClientPause};
use super::{request_seed, split_resume, Registry};
use crate::backend::{Backend, BackendError, BackendLoad, PauseMode, WeightUpdate};

/// Settings of a [`TinkerBackend`]; [`TinkerBackendConfig::new`] fills in the defaults.
#[derive(Clone)]
pub struct TinkerBackendConfig {
    /// The server root, `http://host:port` (no `/api/v1`).
    pub url: String,
    /// Sent as `X-API-Key` (hosted Tinker and TuFT require one; SkyRL ignores it).
    pub api_key: Option<String>,
    /// The model to sample as version 0; `None`: the first the server lists
    /// (`get_server_capabilities`).
    pub base_model: Option<String>,
    /// The backend's name in logs, metrics and errors; `None`: the URL.
    pub name: Option<String>,
    /// Limit on one HTTP request that is not a long poll (a dead server is noticed by the
    /// connection failing, retried per `retry`).
    pub request_timeout: Duration,
    /// Limit on one `retrieve_future` long poll; the client polls again after it.
    pub poll_timeout: Duration,
    /// Limit on one sample in all, queueing on the server included. Below the proxy's own
    /// request timeout, so this one fires first and names the server.
    pub sample_deadline: Duration,
    /// Retries of connection failures and "try again" answers, with backoff.
    pub retry: RetryPolicy,
    /// How often the session is kept alive (SkyRL drops a session after 300 s without).
    pub heartbeat_interval: Duration,
    /// The model's vocabulary size, when known: prompts and sampled ids are checked against it.
    pub vocab_size: Option<usize>,
    /// The version of the base model's weights (tokens sampled before the first update).
    pub initial_version: PolicyVersion,
}

impl std::fmt::Debug for TinkerBackendConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinkerBackendConfig")
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("base_model", &self.base_model)
            .field("name", &self.name)
            .field("request_timeout", &self.request_timeout)
            .field("poll_timeout", &self.poll_timeout)
            .field("sample_deadline", &self.sample_deadline)
            .field("retry", &self.retry)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("vocab_size", &self.vocab_size)
            .field("initial_version", &self.initial_version)
            .finish()
    }
}

impl TinkerBackendConfig {
    /// Defaults for a server at `url`: 60 s per request, 45 s long polls (the SDK's), 600 s per
    /// sample (the HTTP backends' call timeout), the client's default retries (5, from 200 ms to
    /// 5 s), a heartbeat every 10 s (the SDK's), the server's first model, version 0.
    pub fn new(url: impl Into<String>) -> TinkerBackendConfig {
        TinkerBackendConfig {
            url: url.into(),
            api_key: None,
            base_model: None,
            name: None,
            request_timeout: Duration::from_secs(60),
            poll_timeout: Duration::from_secs(45),
            sample_deadline: Duration::from_secs(600),
            retry: RetryPolicy::default(),
            heartbeat_interval: Duration::from_secs(10),
            vocab_size: None,
            initial_version: PolicyVersion::default(),
        }
    }

    fn validate(&self) -> Result<(), BackendError> {
        let bad = |reason: String| {
            Err(BackendError::InvalidRequest {
                reason,
                source: None,
            })
        };
        if !self.url.starts_with("http://") {
            return bad(format!(
                "tinker url must start with http:// (this build has no TLS), got {:?}",
                self.url
            ));
        }
        if self.request_timeout.is_zero()
            || self.poll_timeout.is_zero()
            || self.sample_deadline.is_zero()
            || self.heartbeat_interval.is_zero()
        {
            return bad(format!(
                "{}: request_timeout, poll_timeout, sample_deadline and heartbeat_interval \
                 must be positive",
                self.url
            ));
        }
        Ok(())
    }
}

/// A sampling session and the version of the weights it samples.
#[derive(Debug)]
struct Sampler {
    id: String,
    version: PolicyVersion,
    /// A `tinker://` path, or the base model's name.
    source: String,
}

/// A Tinker server's sampling API as a backend (see the module docs).
pub struct TinkerBackend {
    name: String,
    /// The server root, for messages.
    url: String,
    client: TinkerClient,
    session_id: String,
    base_model: String,
    vocab_size: Option<usize>,
    /// The current sampling session. A std lock: held only to clone or replace the `Arc`,
    /// never across an `.await`.
    sampler: RwLock<Arc<Sampler>>,
    /// One weight update at a time, so sampling sessions are created and swapped in order.
    updating: tokio::sync::Mutex<()>,
    /// The session's sampling-session counter (the protocol's `sampling_session_seq_id`).
    sampler_seq: AtomicU32,
    /// `seq_id` of each `asample` (SkyRL requires one; it is not an idempotency key there).
    sample_seq: AtomicI32,
    inflight: Registry,
    /// The protocol has no pause: new requests wait on the client side.
    paused: ClientPause,
    /// Keeps the session alive; dropping the backend aborts it.
    _heartbeat: Heartbeat,
}

impl std::fmt::Debug for TinkerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinkerBackend")
            .field("name", &self.name)
            .field("session_id", &self.session_id)
            .field("base_model", &self.base_model)
            .finish()
    }
}

impl TinkerBackend {
    /// Connects: checks the server answers, picks the base model, opens a session (and its
    /// heartbeat), and a sampling session on the base model as `cfg.initial_version`, which
    /// it samples one token from (a wrong model name or a server whose engine is not up is
    /// an error here, not at the first request).
    pub async fn connect(cfg: TinkerBackendConfig) -> Result<TinkerBackend, BackendError> {
        cfg.validate()?;
        let url = cfg.url.trim_end_matches('/').to_string();
        let name = cfg.name.clone().unwrap_or_else(|| url.clone());
        let mut ccfg = ClientConfig::new(url.clone());
        ccfg.api_key = cfg.api_key.clone();
        ccfg.request_timeout = cfg.request_timeout;
        ccfg.poll_timeout = cfg.poll_timeout;
        ccfg.future_deadline = cfg.sample_deadline;
        ccfg.retry = cfg.retry.clone();
        let err = |e: TinkerError| map_error(&name, Call::Control, e);
        let client = TinkerClient::new(ccfg).map_err(err)?;
        client.healthz().await.map_err(err)?;
        let base_model = match cfg.base_model.clone() {
            Some(m) => m,
            None => client
                .capabilities()
                .await
                .map_err(err)?
                .supported_models
                .into_iter()
                .find_map(|m| m.model_name)
                .ok_or_else(|| BackendError::Protocol {
                    backend: name.clone(),
                    reason: format!("{url} lists no supported model and none was configured"),
                    source: None,
                })?,
        };
        let session_id = client
            .create_session(vec!["rollflash-rollout".into()])
            .await
            .map_err(err)?;
        let heartbeat =
            Heartbeat::spawn(client.clone(), session_id.clone(), cfg.heartbeat_interval);
        let sampler_id = client
            .create_sampling_session(&session_id, 0, SamplerSource::BaseModel(&base_model))
            .await
            .map_err(err)?;
        let backend = TinkerBackend {
            name,
            url,
            client,
            session_id,
            vocab_size: cfg.vocab_size,
            sampler: RwLock::new(Arc::new(Sampler {
                id: sampler_id,
                version: cfg.initial_version,
                source: base_model.clone(),
            })),
            base_model,
            updating: tokio::sync::Mutex::new(()),
            sampler_seq: AtomicU32::new(1),
            sample_seq: AtomicI32::new(1),
            inflight: Registry::default(),
            paused: ClientPause::new(),
            _heartbeat: heartbeat,
        };
        let current = backend.current();
        backend.probe(&current.id, &current.source).await?;
        Ok(backend)
    }

    /// The served model this backend samples as its initial version.
    pub fn base_model(&self) -> &str {
        &self.base_model
    }

    /// The Tinker session it holds.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The client it talks through (for calls beyond sampling, on the same server).
    pub fn client(&self) -> &TinkerClient {
        &self.client
    }

    fn current(&self) -> Arc<Sampler> {
        match self.sampler.read() {
            Ok(g) => Arc::clone(&g),
            // Only a panic while swapping an `Arc` could poison it; the `Arc` is whole.
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    fn next_sample_seq(&self) -> i32 {
        // Wraps past i32::MAX back to 1: the server does not deduplicate samples by it.
        let s = self.sample_seq.fetch_add(1, Ordering::Relaxed);
        if s <= 0 {
            self.sample_seq.store(2, Ordering::Relaxed);
            1
        } else {
            s
        }
    }

    /// Samples one greedy token of a one-token prompt from `sampler_id`: the server then has
    /// checked and loaded those weights.
    async fn probe(&self, sampler_id: &str, source: &str) -> Result<(), BackendError> {
        let params = rollflash_tinker::SamplingParams {
            max_tokens: 1,
            seed: Some(0),
            stop: Vec::new(),
            temperature: 0.0,
            top_k: -1,
            top_p: 1.0,
        };
        let out = self
            .client
            .sample(sampler_id, self.next_sample_seq(), &[0], 1, params, false)
            .await
            .map_err(|e| self.error(e))?;
        if out.sequences.len() != 1 || out.sequences[0].tokens.len() != 1 {
            return Err(self.protocol(format!(
                "a one-token probe of {source} came back as {:?}",
                out.sequences
            )));
        }
        Ok(())
    }

    fn error(&self, e: TinkerError) -> BackendError {
        map_error(&self.name, Call::Control, e)
    }

    fn protocol(&self, reason: String) -> BackendError {
        BackendError::Protocol {
            backend: self.name.clone(),
            reason: format!("{}: {reason}", self.url),
            source: None,
        }
    }

    fn invalid(&self, reason: String) -> BackendError {
        BackendError::InvalidRequest {
            reason: format!("{}: {reason}", self.name),
            source: None,
        }
    }

    /// Token ids as the protocol's i32, checked against the vocabulary when known.
    fn to_wire(&self, what: &str, ids: &[u32]) -> Result<Vec<i32>, BackendError> {
        ids.iter()
            .map(|&t| {
                let in_vocab = self.vocab_size.is_none_or(|v| (t as usize) < v);
                match i32::try_from(t) {
                    Ok(x) if in_vocab => Ok(x),
                    _ => Err(self.invalid(format!(
                        "{what} token id {t} is outside the vocabulary{}",
                        self.vocab_size
                            .map(|v| format!(" (size {v})"))
                            .unwrap_or_default()
                    ))),
                }
            })
            .collect()
    }

    /// Checks one sample reply and turns it into our tokens and finish reason.
    fn read_sample(
        &self,
        out: SampleOutput,
        left: usize,
        stop_ids: &[u32],
        version: PolicyVersion,
    ) -> Result<(Generated, FinishReason), BackendError> {
        let [seq] = <[_; 1]>::try_from(out.sequences).map_err(|seqs| {
            self.protocol(format!(
                "asample: {} sequences for num_samples 1",
                seqs.len()
            ))
        })?;
        let n = seq.tokens.len();
        let logprobs = seq
            .logprobs
            .ok_or_else(|| self.protocol("asample: the sequence has no logprobs".into()))?;
        if logprobs.len() != n {
            return Err(self.protocol(format!(
                "asample: {n} tokens but {} logprobs",
                logprobs.len()
            )));
        }
        if n == 0 || n > left {
            return Err(self.protocol(format!("asample: {n} tokens for max_tokens {left}")));
        }
        let mut tokens = Vec::with_capacity(n);
        for (i, &t) in seq.tokens.iter().enumerate() {
            let id = u32::try_from(t)
                .ok()
                .filter(|&id| self.vocab_size.is_none_or(|v| (id as usize) < v))
                .ok_or_else(|| {
                    self.protocol(format!("asample: token {i} is {t}, not a vocabulary id"))
                })?;
            tokens.push(id);
        }
        // f32 rounding can put a certain token's log-prob a hair above 0.
        if let Some((i, lp)) = logprobs
            .iter()
            .enumerate()
            .find(|(_, lp)| !(lp.is_finite() && **lp <= 1e-4))
        {
            return Err(self.protocol(format!("asample: logprob {i} is {lp}")));
        }
        let ends_on_stop = tokens.last().is_some_and(|t| stop_ids.contains(t));
        let finish = match seq.stop_reason {
            StopReason::Stop if ends_on_stop => FinishReason::Stop,
            StopReason::Stop => {
                return Err(self.protocol(format!(
                    "asample: stop reason `stop` but the last token {:?} is not one of the stop \
                     ids {stop_ids:?}",
                    tokens.last()
                )))
            }
            // A stop token sampled as the last allowed token is still a stop.
            StopReason::Length if ends_on_stop => FinishReason::Stop,
            StopReason::Length if n == left => FinishReason::Length,
            StopReason::Length => {
                return Err(self.protocol(format!(
                    "asample: stop reason `length` after {n} of {left} tokens"
                )))
            }
        };
        Ok((
            Generated {
                tokens,
                logprobs,
                versions: vec![version; n],
            },
            finish,
        ))
    }
}

/// The seed sent for `req` after `resumed` tokens: the request's seed moved on by the resumed
/// length (so a resumed attempt does not replay the stream from its start), folded into the
/// 31 bits SkyRL's sampler takes.
fn wire_seed(req: &GenRequest, resumed: usize) -> i64 {
    let s = request_seed(req).wrapping_add((resumed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    ((s ^ (s >> 31) ^ (s >> 62)) & 0x7FFF_FFFF) as i64
}

/// What a failed call was for: the same server answer means different things.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    /// A request's `asample` on the current sampling session.
    Generate,
    /// Connecting, or a weight update: what the caller asked for is what is refused.
    Control,
}

/// The `BackendError` for a failed Tinker call: transport and 5xx/408/429 answers are
/// `Unavailable` (another backend may serve), refusals (other 4xx, a future the server failed
/// for the request's sake) `InvalidRequest`, a future past its deadline `Timeout`, an answer
/// we cannot read `Protocol`. The `TinkerError` is the source; its text names the call and the
/// URL.
///
/// For a request's sample, a 404 and a failed future are the backend's state, not the
/// request's fault, so `Unavailable`: the server checks a request when it accepts it (422,
/// 400), and what fails after that (SkyRL: "Model … not loaded" once a restart dropped the
/// model the sampling session reads; an engine error that fails the whole batch) or cannot
/// find our sampling session would fail every request alike. Only a failure the server
/// classifies as the user's (hosted Tinker's `category: user`) stays the request's.
fn map_error(backend: &str, call: Call, e: TinkerError) -> BackendError {
    let backend = backend.to_string();
    let unavailable = |reason: &str, e: TinkerError| BackendError::Unavailable {
        backend: backend.clone(),
        reason: reason.into(),
        source: Some(Box::new(e)),
    };
    match e {
        TinkerError::Unreachable { .. } | TinkerError::Transport { .. } | TinkerError::Setup(_) => {
            unavailable("the Tinker server failed", e)
        }
        TinkerError::Status { status, .. } if matches!(status, 408 | 429) || status >= 500 => {
            unavailable("the Tinker server failed", e)
        }
        TinkerError::Status { status: 404, .. } if call == Call::Generate => unavailable(
            "the Tinker server no longer knows this backend's session (restarted?)",
            e,
        ),
        TinkerError::FutureFailed {
            ref category,
            status,
            ..
        } if category.as_deref() == Some("server")
            || status.is_some_and(|s| s >= 500)
            || (call == Call::Generate && category.as_deref() != Some("user")) =>
        {
            unavailable(
                "the Tinker server failed the sample (its weights gone after a restart?)",
                e,
            )
        }
        TinkerError::Status { .. }
        | TinkerError::FutureFailed { .. }
        | TinkerError::InvalidInput { .. } => BackendError::InvalidRequest {
            reason: format!("{backend} refused the request"),
            source: Some(Box::new(e)),
        },
        TinkerError::FutureTimeout { waited, .. } => BackendError::Timeout {
            backend,
            secs: waited.as_secs_f64(),
        },
        TinkerError::Decode { .. } => BackendError::Protocol {
            backend,
            reason: "cannot read the Tinker server's answer".into(),
            source: Some(Box::new(e)),
        },
    }
}

#[async_trait]
impl Backend for TinkerBackend {
    fn name(&self) -> &str {
        &self.name
    }

    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        req.params
            .validate()
            .map_err(|e| self.invalid(e.to_string()))?;
        if req.prompt.is_empty() {
            return Err(self.invalid(format!("{}: empty prompt", req.id)));
        }
        let (mut output, left) = split_resume(&req);
        let Some(left) = left else {
            return Ok(finished(&req, output, FinishReason::Length));
        };
        let p = &req.params;
        let mut prompt = self.to_wire("prompt", &req.prompt)?;
        prompt.extend(self.to_wire("resumed", &output.tokens)?);
        let stop = self.to_wire("stop", &p.stop_token_ids)?;
        let params = rollflash_tinker::SamplingParams {
            max_tokens: u32::try_from(left)
                .map_err(|_| self.invalid(format!("max_new_tokens {left} is too large")))?,
            seed: Some(wire_seed(&req, output.len())),
            stop,
            temperature: p.temperature,
            top_k: if p.top_k == 0 {
                -1
            } else {
                i32::try_from(p.top_k).unwrap_or(i32::MAX)
            },
            top_p: p.top_p,
        };

        let ticket = self.inflight.register(req.id, &self.name)?;
        if !self.paused.admit(&ticket).await {
            return Ok(finished(&req, output, FinishReason::Aborted));
        }
        // The session at submit: its version is the tokens' even if an update swaps it
        // while the sample runs (the sample runs on these weights to the end).
        let sampler = self.current();
        let call = self.client.sample(
            &sampler.id,
            self.next_sample_seq(),
            &prompt,
            1,
            params,
            false,
        );
        let answer = tokio::select! {
            r = call => r,
            // No abort on the wire: we stop waiting; the server finishes the sample for
            // nobody (see the module docs).
            _ = ticket.aborted() => return Ok(finished(&req, output, FinishReason::Aborted)),
        };
        drop(ticket);
        let out = answer.map_err(|e| map_error(&self.name, Call::Generate, e))?;
        let (new, finish) = self.read_sample(out, left, &p.stop_token_ids, sampler.version)?;
        output.extend(&new);
        Ok(finished(&req, output, finish))
    }

    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        self.inflight.abort(id);
        Ok(())
    }

    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        self.paused.pause(mode, &self.inflight);
        Ok(())
    }

    async fn resume(&self) -> Result<(), BackendError> {
        self.paused.resume();
        Ok(())
    }

    async fn update_weights(&self, update: &WeightUpdate) -> Result<(), BackendError> {
        let WeightUpdate::Remote { uri, version } = update else {
            return Err(BackendError::InvalidRequest {
                reason: format!(
                    "{}: a Tinker server samples only weights it holds: send \
                     WeightUpdate::Remote with the tinker:// path save_weights_for_sampler \
                     returned, not {update:?}",
                    self.name
                ),
                source: None,
            });
        };
        let _one_at_a_time = self.updating.lock().await;
        let seq = self.sampler_seq.fetch_add(1, Ordering::Relaxed);
        let id = self
            .client
            .create_sampling_session(&self.session_id, seq, SamplerSource::ModelPath(uri))
            .await
            .map_err(|e| self.error(e))?;
        self.probe(&id, uri).await?;
        let next = Arc::new(Sampler {
            id,
            version: *version,
            source: uri.clone(),
        });
        match self.sampler.write() {
            Ok(mut g) => *g = next,
            Err(p) => *p.into_inner() = next,
        }
        Ok(())
    }

    async fn load(&self) -> Result<BackendLoad, BackendError> {
        Ok(load_of(&self.inflight, self.current().version))
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.client.healthz().await.map_err(|e| self.error(e))?;
        // The session too: a server that lost it (expired, or a fresh database) answers
        // healthz but would refuse our samples.
        self.client
            .heartbeat(&self.session_id)
            .await
            .map_err(|e| self.error(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rollflash_core::SamplingParams;

    #[test]
    fn seeds_fit_31_bits_and_move_with_the_resumed_length() {
        for id in [0u64, 1, 7, u64::MAX / 3, u64::MAX] {
            let req = GenRequest::new(RequestId(id), vec![1], SamplingParams::default());
            for resumed in [0usize, 1, 5, 1000] {
                let s = wire_seed(&req, resumed);
                assert!((0..=0x7FFF_FFFF).contains(&s), "{s}");
            }
            assert_ne!(wire_seed(&req, 0), wire_seed(&req, 1));
        }
        let p = SamplingParams {
            seed: Some(42),
            ..Default::default()
        };
        let a = GenRequest::new(RequestId(1), vec![1], p.clone());
        let b = GenRequest::new(RequestId(2), vec![1], p);
        assert_eq!(wire_seed(&a, 0), wire_seed(&b, 0), "an explicit seed wins");
    }

    #[test]
    fn errors_map_by_what_went_wrong() {
        let status = |s: u16| TinkerError::Status {
            call: "asample",
            url: "http://x/api/v1/asample".into(),
            status: s,
            body: "{}".into(),
        };
        let control = |e| map_error("b", Call::Control, e);
        let generate = |e| map_error("b", Call::Generate, e);
        assert!(control(status(503)).is_retryable());
        assert!(control(status(429)).is_retryable());
        assert!(matches!(
            control(status(404)),
            BackendError::InvalidRequest { .. }
        ));
        assert!(
            generate(status(404)).is_retryable(),
            "our sampling session is gone"
        );
        assert!(!generate(status(422)).is_retryable());
        let failed = |category: Option<&str>| TinkerError::FutureFailed {
            call: "asample",
            request_id: "1".into(),
            status: Some(400),
            message: "no".into(),
            category: category.map(str::to_string),
            body: "{}".into(),
        };
        assert!(!control(failed(None)).is_retryable());
        assert!(control(failed(Some("server"))).is_retryable());
        assert!(
            generate(failed(None)).is_retryable(),
            "SkyRL's `Model … not loaded`"
        );
        assert!(!generate(failed(Some("user"))).is_retryable());
        let timeout = TinkerError::FutureTimeout {
            call: "asample",
            request_id: "1".into(),
            waited: Duration::from_secs(3),
        };
        assert!(matches!(control(timeout), BackendError::Timeout { .. }));
    }
}
