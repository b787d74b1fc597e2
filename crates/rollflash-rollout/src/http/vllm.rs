//! [`VllmBackend`]: a vLLM server as a [`Backend`], on vLLM's own RL routes (the server runs
//! with `VLLM_SERVER_DEV_MODE=1`; `scripts/start_vllm.sh` starts one).
//!
//! Generation: token ids in, token ids and per-token log-probs out, through
//! `POST /inference/v1/generate` (vLLM's token-in/token-out route, on with
//! `--enable-scale-out`): `{request_id, token_ids, model, output_mode: "tokens",
//! sampling_params: {temperature, top_p, top_k, max_tokens, seed, logprobs: 0, stop_token_ids,
//! ignore_eos}}` → `choices[0]{token_ids, logprobs.content[{token_id, logprob}], finish_reason,
//! weight_versions[{version, start, end}]}`. The weight-version spans say which weights sampled
//! which output tokens, so a request kept in place across a weight update (`pause(Keep)`)
//! labels its tokens with the version that really produced them. A server without that route
//! (404) is asked on `POST /v1/completions` instead (prompt as ids, `return_token_ids`,
//! `return_tokens_as_token_ids`, `logprobs: 0`): the same tokens and log-probs, but no spans, so
//! there every token of a call gets the version this backend knew when the call was sent. On
//! first contact a fresh server's weight label (`default`) is set to the initial version.
//!
//! Seeds: vLLM refuses seeds outside i64 with HTTP 400, so the id-derived seed is masked to 63
//! bits; a resumed attempt mixes in the resumed length, so it does not replay the random
//! stream of the first attempt from position 0.
//!
//! Aborts: `POST /abort_requests {request_ids}` with the id vLLM's engine knows
//! (`generate-tokens-<request_id>` on the generate route, `cmpl-<request_id>-0` on
//! completions), re-sent with backoff until the generation answers; the answer carries the
//! partial output (`finish_reason: "abort"`), which is kept. Pauses are server-side:
//! `POST /pause?mode=abort|keep|wait`, `POST /resume`.
//!
//! Weights (`WeightUpdate::Disk` only): pause in keep mode (unless this backend is already
//! paused) → `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path"}}` →
//! `POST /reset_prefix_cache` → `POST /update_weight_version {new_version}` → resume; then
//! `GET /weight_info` must report the new version, or the update is an error. vLLM's
//! `weight_version` is a label it stores, not a fingerprint of the tensors: what the check
//! proves is that this server took the whole sequence, in order, after the reload succeeded.
//!
//! Adapters (`WeightUpdate::Adapter`; server started with `--enable-lora --max-lora-rank R`
//! and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`): `POST /v1/load_lora_adapter {lora_name,
//! lora_path}`, then `GET /v1/models` must list `lora_name` (the served-version check: one
//! name per version); from then on every call names the adapter as its `model`, and all of
//! its tokens carry that adapter's version (vLLM's weight-version spans label the base, not
//! the adapter, so they are not read then). The base is loaded once. All but the newest
//! [`super::common::ADAPTERS_KEPT`] adapters are unloaded (`POST /v1/unload_lora_adapter
//! {lora_name}`). A server without the routes (404) or refusing the adapter (400: LoRA off,
//! rank too large) answers `Unsupported`, so the caller can fall back to merged weights.
//!
//! Finish reasons: `stop`, `length`, `abort`, and vLLM's `repetition` (its repetition
//! detector ended the generation: a normal end, mapped to `Stop`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use rollflash_core::{FinishReason, GenOutput, GenRequest, Generated, PolicyVersion, RequestId};
use serde_json::{json, Value};
use tokio::sync::OnceCell;

use super::common::{finished, HttpCommon};
use super::openai::parse_completion;
use super::{next_delay, request_seed, split_resume, HttpBackendConfig, HttpClient};
use crate::backend::{Backend, BackendError, BackendLoad, PauseMode, WeightUpdate};

/// vLLM's three pause modes (`POST /pause?mode=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VllmPause {
    /// In-flight requests return their partial output now.
    Abort,
    /// In-flight requests freeze in place and continue (on new weights) after `/resume`.
    Keep,
    /// In-flight requests run to completion, then the server pauses.
    Wait,
}

impl VllmPause {
    fn as_str(self) -> &'static str {
        match self {
            VllmPause::Abort => "abort",
            VllmPause::Keep => "keep",
            VllmPause::Wait => "wait",
        }
    }
}

const GENERATE: &str = "/inference/v1/generate";
const LOAD_LORA: &str = "/v1/load_lora_adapter";
const UNLOAD_LORA: &str = "/v1/unload_lora_adapter";
const COMPLETIONS: &str = "/v1/completions";

/// A remote vLLM server as a backend.
pub struct VllmBackend {
    common: HttpCommon,
    /// The model to request; `None` takes the first one `/v1/models` lists.
    expected_model: Option<String>,
    model: OnceCell<String>,
    /// Makes request ids unique across backends sharing a server: a random tag per instance
    /// and a counter per call.
    rid_tag: u32,
    rid_seq: AtomicU64,
    /// Set once the server answered 404 on the generate route: completions are used instead.
    use_completions: AtomicBool,
    /// Whether a server-side pause made through this backend is in force.
    paused: AtomicBool,
}

impl std::fmt::Debug for VllmBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VllmBackend")
            .field("name", &self.http().name())
            .finish()
    }
}

/// What one generation call returned.
struct Answer {
    new: Generated,
    finish: FinishReason,
}

impl VllmBackend {
    fn http(&self) -> &HttpClient {
        &self.common.http
    }

    /// A backend for the vLLM server at `cfg.base_url` (a trailing `/v1` is accepted). Nothing
    /// is contacted until the first call.
    pub fn new(mut cfg: HttpBackendConfig) -> Result<Self, BackendError> {
        let trimmed = cfg.base_url.trim_end_matches('/');
        cfg.base_url = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string();
        Ok(VllmBackend {
            common: HttpCommon::new(&cfg)?,
            expected_model: None,
            model: OnceCell::new(),
            rid_tag: rand::random(),
            rid_seq: AtomicU64::new(0),
            use_completions: AtomicBool::new(false),
            paused: AtomicBool::new(false),
        })
    }

    /// Requests `model` (vLLM's `--served-model-name`); the first call checks that the server
    /// serves it and fails naming both otherwise.
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.expected_model = Some(model.into());
        self
    }

    /// The model name requests carry, checked against `GET /v1/models` once.
    pub async fn model(&self) -> Result<&str, BackendError> {
        let m = self
            .model
            .get_or_try_init(|| async {
                let list = self.http().get("/v1/models").await?;
                let served: Vec<String> = list
                    .get("data")
                    .and_then(Value::as_array)
                    .map(|d| {
                        d.iter()
                            .filter_map(|m| m.get("id").and_then(Value::as_str))
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                self.label_initial_weights().await?;
                match &self.expected_model {
                    Some(want) if served.iter().any(|s| s == want) => Ok(want.clone()),
                    Some(want) => Err(BackendError::InvalidRequest {
                        reason: format!(
                            "vLLM at {} does not serve the model `{want}` (it serves {served:?}; \
                             set the model to one of those, or start vLLM with \
                             --served-model-name {want})",
                            self.http().name()
                        ),
                        source: None,
                    }),
                    None => served
                        .into_iter()
                        .next()
                        .ok_or_else(|| self.http().protocol("/v1/models", "no model listed")),
                }
            })
            .await?;
        Ok(m.as_str())
    }

    /// A fresh vLLM labels its weights `default`, which is no policy version: on first contact
    /// the label becomes this backend's initial version, so the weight-version spans of every
    /// answer are numbers. A numeric label already there (an earlier run's update) is kept:
    /// it says what the server really serves.
    async fn label_initial_weights(&self) -> Result<(), BackendError> {
        if self.served_version().await?.is_none() {
            let label = self.common.version.get().0.to_string();
            self.http()
                .post("/update_weight_version", &json!({ "new_version": label }))
                .await?;
        }
        Ok(())
    }

    /// Pauses the server in any of vLLM's modes (the `Backend` trait knows abort and keep;
    /// `Wait` drains first).
    pub async fn pause_server(&self, mode: VllmPause) -> Result<(), BackendError> {
        let route = format!("/pause?mode={}", mode.as_str());
        self.http().post(&route, &json!({})).await?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The weight version the server reports (`GET /weight_info`), as a policy version;
    /// `None` when it has none or it is not a number.
    pub async fn served_version(&self) -> Result<Option<PolicyVersion>, BackendError> {
        let info = self.http().get("/weight_info").await?;
        Ok(info
            .get("weight_version")
            .and_then(crate::server::parse_version))
    }

    fn seed(req: &GenRequest, resumed: usize) -> u64 {
        // vLLM takes seeds in i64 only; the golden-ratio step keeps resumed attempts apart.
        request_seed(req).wrapping_add((resumed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            & (i64::MAX as u64)
    }

    fn sampling_params(req: &GenRequest, resumed: usize, left: usize) -> Value {
        let p = &req.params;
        let mut sp = json!({
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_tokens": left,
            "seed": Self::seed(req, resumed),
            "logprobs": 0,
            "stop_token_ids": p.stop_token_ids,
        });
        if p.top_k > 0 {
            sp["top_k"] = json!(p.top_k);
        }
        if p.stop_token_ids.is_empty() {
            // No stop tokens asked for: run to the budget, as the engine does (vLLM would
            // otherwise stop at the model's eos).
            sp["ignore_eos"] = json!(true);
        }
        sp
    }

    /// The route, body and abort id of one call.
    async fn call_body(
        &self,
        req: &GenRequest,
        resumed: &Generated,
        left: usize,
        rid: &str,
        completions: bool,
        adapter: Option<&str>,
    ) -> Result<(&'static str, Value, String), BackendError> {
        let mut ids = req.prompt.clone();
        ids.extend_from_slice(&resumed.tokens);
        let base = self.model().await?;
        let model = adapter.unwrap_or(base);
        let sp = Self::sampling_params(req, resumed.len(), left);
        if completions {
            let mut body = sp;
            body["model"] = json!(model);
            body["prompt"] = json!(ids);
            body["request_id"] = json!(rid);
            body["return_token_ids"] = json!(true);
            body["return_tokens_as_token_ids"] = json!(true);
            Ok((COMPLETIONS, body, format!("cmpl-{rid}-0")))
        } else {
            let body = json!({
                "request_id": rid,
                "token_ids": ids,
                "model": model,
                "output_mode": "tokens",
                "sampling_params": sp,
            });
            Ok((GENERATE, body, format!("generate-tokens-{rid}")))
        }
    }

    /// Sends `/abort_requests` for `vllm_id` until the generation answers. Repeating covers an
    /// abort that reached the server before the request did (vLLM ignores unknown ids).
    async fn abort_until_done(
        &self,
        vllm_id: &str,
        call: &mut std::pin::Pin<
            &mut impl std::future::Future<Output = Result<Value, BackendError>>,
        >,
    ) -> Result<Value, BackendError> {
        let mut delay = self.http().config().backoff_initial;
        loop {
            let body = json!({ "request_ids": [vllm_id] });
            if let Err(e) = self.http().post("/abort_requests", &body).await {
                tracing::debug!(backend = %self.http().name(), vllm_id, "abort_requests failed: {e}");
            }
            tokio::select! {
                r = call.as_mut() => return r,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = next_delay(delay, self.http().config());
        }
    }

    /// Reads a generate-route answer.
    fn parse_generate(
        &self,
        v: &Value,
        at_dispatch: PolicyVersion,
    ) -> Result<Answer, BackendError> {
        let bad = |reason: String| self.http().protocol(GENERATE, reason);
        let choice = v
            .pointer("/choices/0")
            .ok_or_else(|| bad("answer has no choices".into()))?;
        let tokens: Vec<u32> = choice
            .get("token_ids")
            .cloned()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| bad(format!("token_ids: {e}")))?
            .unwrap_or_default();
        let entries = choice
            .pointer("/logprobs/content")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if entries.len() != tokens.len() {
            return Err(bad(format!(
                "{} output tokens but {} log-prob entries (was logprobs ignored?)",
                tokens.len(),
                entries.len()
            )));
        }
        let mut logprobs = Vec::with_capacity(tokens.len());
        for (i, (e, &t)) in entries.iter().zip(&tokens).enumerate() {
            let lp = e.get("logprob").and_then(Value::as_f64);
            let id = e.get("token_id").and_then(Value::as_u64);
            match (lp, id) {
                (Some(lp), Some(id)) if id == u64::from(t) => logprobs.push(lp as f32),
                _ => {
                    return Err(bad(format!(
                        "logprobs.content[{i}] is not {{token_id: {t}, logprob}}: {e}"
                    )))
                }
            }
        }
        let versions =
            self.versions_from_spans(choice.get("weight_versions"), tokens.len(), at_dispatch)?;
        let finish = parse_finish(choice.get("finish_reason")).map_err(bad)?;
        Ok(Answer {
            new: Generated {
                tokens,
                logprobs,
                versions,
            },
            finish,
        })
    }

    /// Per-token versions from vLLM's `weight_versions` spans; tokens outside every numeric
    /// span get `fallback`, the version this backend knew when the call was sent.
    fn versions_from_spans(
        &self,
        spans: Option<&Value>,
        n: usize,
        fallback: PolicyVersion,
    ) -> Result<Vec<PolicyVersion>, BackendError> {
        let mut out = vec![fallback; n];
        let Some(Value::Array(spans)) = spans else {
            return Ok(out);
        };
        for s in spans {
            let version = s.get("version").and_then(crate::server::parse_version);
            let start = s.get("start").and_then(Value::as_u64);
            let end = s.get("end").and_then(Value::as_u64);
            let (Some(start), Some(end)) = (start, end) else {
                return Err(self.http().protocol(
                    GENERATE,
                    format!("weight_versions entry {s} has no start/end"),
                ));
            };
            let (start, end) = (start as usize, (end as usize).min(n));
            // A label that is not one of our numbers (set by someone else) is not trusted.
            let Some(v) = version else { continue };
            for slot in out.iter_mut().take(end).skip(start) {
                *slot = v;
            }
        }
        Ok(out)
    }

    /// One generation call, with its abort handling; falls back to completions on a 404.
    async fn call(
        &self,
        req: &GenRequest,
        resumed: &Generated,
        left: usize,
        ticket: &super::Ticket<'_>,
    ) -> Result<Option<Answer>, BackendError> {
        loop {
            let completions = self.use_completions.load(Ordering::SeqCst);
            let rid = format!(
                "rf-{:08x}-{}-{}",
                self.rid_tag,
                req.id.0,
                self.rid_seq.fetch_add(1, Ordering::Relaxed)
            );
            // The adapter and the version are read together: the adapter named is the
            // version every token of this call is.
            let adapter = self.common.current_adapter();
            let (route, body, vllm_id) = self
                .call_body(
                    req,
                    resumed,
                    left,
                    &rid,
                    completions,
                    adapter.as_ref().map(|(n, _)| n.as_str()),
                )
                .await?;
            let at_dispatch = match &adapter {
                Some((_, v)) => *v,
                None => self.common.version.get(),
            };
            let call = self.http().post(route, &body);
            tokio::pin!(call);
            let mut aborted = false;
            let answer = tokio::select! {
                r = call.as_mut() => r,
                _ = ticket.aborted() => {
                    aborted = true;
                    self.abort_until_done(&vllm_id, &mut call).await
                }
            };
            let answer = match answer {
                Ok(v) => v,
                Err(BackendError::Unsupported { what, .. }) if !completions => {
                    tracing::warn!(
                        backend = %self.http().name(),
                        "vLLM has no {GENERATE} ({what}; start it with --enable-scale-out): \
                         using {COMPLETIONS}, without per-token weight versions"
                    );
                    self.use_completions.store(true, Ordering::SeqCst);
                    continue;
                }
                Err(e) if aborted => {
                    tracing::debug!(backend = %self.http().name(), "aborted request failed: {e}");
                    return Ok(None);
                }
                Err(e) => return Err(self.name_model_error(e)),
            };
            return if completions {
                let p = parse_completion_vllm(&answer)
                    .map_err(|e| self.http().protocol(COMPLETIONS, e))?;
                let n = p.tokens.len();
                Ok(Some(Answer {
                    new: Generated {
                        tokens: p.tokens,
                        logprobs: p.logprobs,
                        versions: vec![at_dispatch; n],
                    },
                    finish: p.finish,
                }))
            } else {
                let mut a = self.parse_generate(&answer, at_dispatch)?;
                if adapter.is_some() {
                    a.new.versions = vec![at_dispatch; a.new.tokens.len()];
                }
                Ok(Some(a))
            };
        }
    }

    /// The names `GET /v1/models` lists (the base and every loaded adapter).
    async fn served_names(&self) -> Result<Vec<String>, BackendError> {
        let list = self.http().get("/v1/models").await?;
        Ok(list
            .get("data")
            .and_then(Value::as_array)
            .map(|d| {
                d.iter()
                    .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Loads an adapter, checks the server lists it, makes it the one calls name, and
    /// unloads the oldest beyond [`super::common::ADAPTERS_KEPT`].
    async fn load_adapter(
        &self,
        dir: &std::path::Path,
        name: &str,
        version: PolicyVersion,
    ) -> Result<(), BackendError> {
        // vLLM refuses (400) a name it already holds, and what it holds under the name may be
        // another run's (a run resumed, or restarted, against the same server publishes its
        // versions again): it is unloaded first, so the name always means this directory.
        if self.served_names().await?.iter().any(|s| s == name) {
            self.http()
                .post_text_ok(UNLOAD_LORA, &json!({ "lora_name": name }))
                .await?;
        }
        let body = json!({ "lora_name": name, "lora_path": dir.to_string_lossy() });
        // A 404 means vLLM was started without VLLM_ALLOW_RUNTIME_LORA_UPDATING; a 400, LoRA
        // off or a rank above --max-lora-rank.
        self.http()
            .post_text_ok(LOAD_LORA, &body)
            .await
            .map_err(|e| self.common.adapter_refused(LOAD_LORA, e))?;
        let served = self.served_names().await?;
        if !served.iter().any(|s| s == name) {
            return Err(self.http().protocol(
                "/v1/models",
                format!("adapter `{name}` was loaded but is not listed (it lists {served:?})"),
            ));
        }
        self.common.adapter_loaded(name, version, UNLOAD_LORA).await;
        Ok(())
    }

    /// vLLM answers a model it does not serve with 404 ("The model `x` does not exist"),
    /// which the transport maps to `Unsupported`: say what it is.
    fn name_model_error(&self, e: BackendError) -> BackendError {
        match e {
            BackendError::Unsupported { what, .. } if what.contains("does not exist") => {
                BackendError::InvalidRequest {
                    reason: format!(
                        "vLLM at {} does not serve the requested model: {what}",
                        self.http().name()
                    ),
                    source: None,
                }
            }
            e => e,
        }
    }
}

/// vLLM's finish reasons.
fn parse_finish(v: Option<&Value>) -> Result<FinishReason, String> {
    match v.and_then(Value::as_str) {
        Some("stop") => Ok(FinishReason::Stop),
        Some("length") => Ok(FinishReason::Length),
        Some("abort") => Ok(FinishReason::Aborted),
        // vLLM's repetition detector ended the generation: a normal end.
        Some("repetition") => Ok(FinishReason::Stop),
        Some("error") => Err("the server reports an error for this request".into()),
        other => Err(format!("unknown finish_reason {other:?}")),
    }
}

/// A completions answer, with vLLM's `repetition` accepted.
fn parse_completion_vllm(v: &Value) -> Result<super::openai::ParsedCompletion, String> {
    let mut v = v.clone();
    if let Some(f) = v.pointer_mut("/choices/0/finish_reason") {
        if f.as_str() == Some("repetition") {
            *f = json!("stop");
        }
    }
    parse_completion(&v, false)
}

#[async_trait]
impl Backend for VllmBackend {
    fn name(&self) -> &str {
        self.common.name()
    }

    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        let (mut output, left) = split_resume(&req);
        let Some(left) = left else {
            return Ok(finished(&req, output, FinishReason::Length));
        };
        let ticket = self.common.inflight.register(req.id, self.name())?;
        let answer = self.call(&req, &output, left, &ticket).await?;
        drop(ticket);
        match answer {
            Some(a) => {
                output.extend(&a.new);
                Ok(finished(&req, output, a.finish))
            }
            None => Ok(finished(&req, output, FinishReason::Aborted)),
        }
    }

    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        self.common.inflight.abort(id);
        Ok(())
    }

    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        self.pause_server(match mode {
            PauseMode::Abort => VllmPause::Abort,
            PauseMode::Keep => VllmPause::Keep,
        })
        .await
    }

    async fn resume(&self) -> Result<(), BackendError> {
        self.http().post("/resume", &json!({})).await?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    async fn update_weights(&self, update: &WeightUpdate) -> Result<(), BackendError> {
        if let WeightUpdate::Adapter { dir, name, version } = update {
            return self.load_adapter(dir, name, *version).await;
        }
        let (path, version) = self.common.disk_update(update)?;
        // Without a server-side pause around the reload a running request would switch
        // weights mid-generation between two labels.
        let own_pause = !self.paused.load(Ordering::SeqCst);
        if own_pause {
            self.pause_server(VllmPause::Keep).await?;
        }
        let result = async {
            let rpc = json!({
                "method": "reload_weights",
                "kwargs": { "weights_path": path.to_string_lossy() },
            });
            self.http().post("/collective_rpc", &rpc).await?;
            let reset = self.http().post("/reset_prefix_cache", &json!({})).await?;
            if reset.get("success").and_then(Value::as_bool) == Some(false) {
                // Blocks held by requests kept in place cannot be freed; new requests may
                // reuse their prefixes, computed by the previous weights, until they finish.
                tracing::warn!(
                    backend = %self.http().name(),
                    "vLLM could not reset its prefix cache (requests kept in place hold blocks)"
                );
            }
            let label = version.0.to_string();
            self.http()
                .post("/update_weight_version", &json!({ "new_version": label }))
                .await?;
            match self.served_version().await? {
                Some(v) if v == version => Ok(()),
                other => Err(self.http().protocol(
                    "/weight_info",
                    format!("after loading version {version} the server reports {other:?}"),
                )),
            }
        }
        .await;
        if result.is_ok() {
            self.common.weights_loaded(version);
        }
        if own_pause {
            let resumed = self.resume().await;
            result?;
            resumed
        } else {
            result
        }
    }

    async fn load(&self) -> Result<BackendLoad, BackendError> {
        Ok(self.common.load())
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.http().get("/health").await?;
        self.model().await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend() -> VllmBackend {
        VllmBackend::new(HttpBackendConfig::new("http://127.0.0.1:1/v1")).unwrap()
    }

    #[test]
    fn seeds_stay_within_i64() {
        for id in 0..2000u64 {
            let req = GenRequest::new(RequestId(id), vec![1], Default::default());
            for resumed in [0, 1, 17] {
                assert!(VllmBackend::seed(&req, resumed) <= i64::MAX as u64);
            }
            assert_ne!(VllmBackend::seed(&req, 0), VllmBackend::seed(&req, 1));
        }
    }

    #[test]
    fn repetition_is_a_normal_end_and_unknown_reasons_are_errors() {
        assert_eq!(
            parse_finish(Some(&json!("repetition"))),
            Ok(FinishReason::Stop)
        );
        assert_eq!(
            parse_finish(Some(&json!("abort"))),
            Ok(FinishReason::Aborted)
        );
        assert!(parse_finish(Some(&json!("exploded"))).is_err());
    }

    #[test]
    fn generate_answers_are_read_with_their_version_spans() {
        let b = backend();
        assert_eq!(b.http().name(), "http://127.0.0.1:1");
        let answer = json!({
            "request_id": "generate-tokens-x",
            "choices": [{
                "index": 0, "finish_reason": "abort", "token_ids": [5, 6, 7],
                "logprobs": {"content": [
                    {"token_id": 5, "logprob": -0.5, "top_logprobs": []},
                    {"token_id": 6, "logprob": -1.0, "top_logprobs": []},
                    {"token_id": 7, "logprob": -1.5, "top_logprobs": []}
                ]},
                "weight_versions": [
                    {"version": "3", "start": 0, "end": 2},
                    {"version": "4", "start": 2, "end": 3}
                ]
            }]
        });
        let a = b.parse_generate(&answer, PolicyVersion(0)).unwrap();
        assert_eq!(a.new.tokens, vec![5, 6, 7]);
        assert_eq!(a.new.logprobs, vec![-0.5, -1.0, -1.5]);
        assert_eq!(
            a.new.versions,
            vec![PolicyVersion(3), PolicyVersion(3), PolicyVersion(4)]
        );
        assert_eq!(a.finish, FinishReason::Aborted);
    }

    #[test]
    fn mismatched_log_prob_entries_are_protocol_errors() {
        let b = backend();
        let answer = json!({"choices": [{
            "finish_reason": "stop", "token_ids": [5],
            "logprobs": {"content": [{"token_id": 9, "logprob": -0.5}]}
        }]});
        assert!(b.parse_generate(&answer, PolicyVersion(0)).is_err());
    }
}
