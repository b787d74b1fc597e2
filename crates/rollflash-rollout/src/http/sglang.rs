//! [`SglangBackend`]: a server speaking SGLang's native API — SGLang itself, or
//! `rollflash serve` — as a [`Backend`].
//!
//! What is sent to `POST /generate`: `input_ids` (the prompt, then any resumed tokens),
//! `sampling_params` {`temperature`, `top_p`, `top_k` (-1 = off), `max_new_tokens` (what is
//! left after the resumed tokens), `stop_token_ids`, `sampling_seed` (sampled requests only;
//! SGLang ≥ 0.5.3 knows it), `ignore_eos` (only when there are no stop tokens: SGLang always
//! stops at the model's eos otherwise, and `ignore_eos` disables the whole stop check)},
//! `return_logprob: true`, a fresh `rid` per call, and `rollflash_resumed_len` (our extension;
//! SGLang ignores unknown top-level fields) so our server continues the random stream of a
//! resumed request exactly.
//!
//! What is read back: `output_ids` (or the ids in `output_token_logprobs`),
//! `meta_info.output_token_logprobs` (`[[logprob, id, text], ...]`),
//! `meta_info.finish_reason.type` (`stop`/`length`/`abort`), and versions from our
//! `meta_info.output_token_versions`, else SGLang's `meta_info.weight_version` when it is a
//! number, else the last version set through this backend.
//!
//! Weights: `POST /update_weights_from_disk {model_path, weight_version}`, then the served
//! version is read back (`GET /get_weight_version`, else `/get_model_info`) and must be the
//! one just loaded.
//!
//! Adapters (`WeightUpdate::Adapter`): `POST /load_lora_adapter {lora_name, lora_path,
//! rollflash_weight_version}` (the last our extension, so `rollflash serve` labels the
//! adapter's tokens; SGLang ignores it); the answer's `loaded_adapters` must name the adapter
//! when the server lists them (the served-version check: one name per version); from then on
//! `/generate` carries `lora_path: <lora_name>` and every token of a call is the adapter's
//! version. All but the newest [`super::common::ADAPTERS_KEPT`] are unloaded
//! (`POST /unload_lora_adapter {lora_name}`). A server without the route (404), or refusing
//! (400: SGLang started without `--enable-lora`), answers `Unsupported`.

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use rollflash_core::{FinishReason, GenOutput, GenRequest, Generated, PolicyVersion, RequestId};
use serde_json::{json, Value};

use super::common::{finished, HttpCommon};
use super::{next_delay, request_seed, split_resume, HttpBackendConfig, HttpClient};
use crate::backend::{Backend, BackendError, BackendLoad, PauseMode, WeightUpdate};

/// A remote SGLang-native server as a backend.
pub struct SglangBackend {
    common: HttpCommon,
    /// Makes `rid`s unique across backends sharing a server: a random tag per instance and a
    /// counter per call (a retried or resumed request gets a new `rid`).
    rid_tag: u32,
    rid_seq: AtomicU64,
    /// Whether to send `rollflash_resumed_len`.
    resume_hint: bool,
}

impl std::fmt::Debug for SglangBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SglangBackend")
            .field("name", &self.http().name())
            .finish()
    }
}

impl SglangBackend {
    fn http(&self) -> &HttpClient {
        &self.common.http
    }

    /// A backend for the server at `cfg.base_url`. Nothing is contacted until the first call.
    pub fn new(cfg: HttpBackendConfig) -> Result<Self, BackendError> {
        Ok(SglangBackend {
            common: HttpCommon::new(&cfg)?,
            rid_tag: rand::random(),
            rid_seq: AtomicU64::new(0),
            resume_hint: true,
        })
    }

    /// Loads an adapter, checks the server holds it, makes it the one calls name, and
    /// unloads the oldest beyond the number kept.
    async fn load_adapter(
        &self,
        dir: &std::path::Path,
        name: &str,
        version: PolicyVersion,
    ) -> Result<(), BackendError> {
        const ROUTE: &str = "/load_lora_adapter";
        let body = json!({
            "lora_name": name,
            "lora_path": dir.to_string_lossy(),
            "rollflash_weight_version": version.0.to_string(),
        });
        let answer = self
            .http()
            .post(ROUTE, &body)
            .await
            .map_err(|e| self.common.adapter_refused(ROUTE, e))?;
        check_success(self.http(), ROUTE, &answer)?;
        if let Some(Value::Object(loaded)) = answer.get("loaded_adapters") {
            if !loaded.contains_key(name) {
                return Err(self.http().protocol(
                    ROUTE,
                    format!(
                        "adapter `{name}` was loaded but is not listed (it lists {:?})",
                        loaded.keys().collect::<Vec<_>>()
                    ),
                ));
            }
        }
        self.common
            .adapter_loaded(name, version, "/unload_lora_adapter")
            .await;
        Ok(())
    }

    /// Whether to send the `rollflash_resumed_len` extension (default on). Turn it off for a
    /// server that rejects unknown fields; resumed requests then restart their random stream
    /// (greedy ones are unaffected).
    pub fn with_resume_hint(mut self, on: bool) -> Self {
        self.resume_hint = on;
        self
    }

    fn generate_body(
        &self,
        req: &GenRequest,
        resumed: &Generated,
        left: usize,
        rid: &str,
        adapter: Option<&str>,
    ) -> Value {
        let p = &req.params;
        let mut sp = json!({
            "temperature": p.temperature,
            "top_p": p.top_p,
            "top_k": if p.top_k == 0 { -1 } else { p.top_k as i64 },
            "max_new_tokens": left,
            "stop_token_ids": p.stop_token_ids,
        });
        if p.stop_token_ids.is_empty() {
            sp["ignore_eos"] = json!(true);
        }
        if p.temperature > 0.0 {
            sp["sampling_seed"] = json!(request_seed(req));
        }
        let mut ids = req.prompt.clone();
        ids.extend_from_slice(&resumed.tokens);
        let mut body = json!({
            "input_ids": ids,
            "sampling_params": sp,
            "return_logprob": true,
            "rid": rid,
        });
        if self.resume_hint && !resumed.is_empty() {
            body["rollflash_resumed_len"] = json!(resumed.len());
        }
        if let Some(name) = adapter {
            // SGLang's field: the name of a loaded adapter (or a path).
            body["lora_path"] = json!(name);
        }
        body
    }

    /// Sends `/abort_request` for `rid` until the generation answers. Repeating covers an
    /// abort that reached the server before the request did (SGLang ignores unknown rids).
    async fn abort_until_done(
        &self,
        rid: &str,
        call: &mut std::pin::Pin<
            &mut impl std::future::Future<Output = Result<Value, BackendError>>,
        >,
    ) -> Result<Value, BackendError> {
        let mut delay = self.http().config().backoff_initial;
        loop {
            if let Err(e) = self
                .http()
                .post("/abort_request", &json!({ "rid": rid }))
                .await
            {
                tracing::debug!(backend = %self.http().name(), rid, "abort_request failed: {e}");
            }
            tokio::select! {
                r = call.as_mut() => return r,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = next_delay(delay, self.http().config());
        }
    }

    fn parse_generate(
        &self,
        v: &Value,
        aborted: bool,
    ) -> Result<(Generated, FinishReason), BackendError> {
        let route = "/generate";
        let meta = v
            .get("meta_info")
            .ok_or_else(|| self.http().protocol(route, "answer has no `meta_info`"))?;
        let lps = meta
            .get("output_token_logprobs")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                self.http()
                    .protocol(route, "answer has no `meta_info.output_token_logprobs`")
            })?;
        let mut logprobs = Vec::with_capacity(lps.len());
        let mut lp_ids = Vec::with_capacity(lps.len());
        for (i, e) in lps.iter().enumerate() {
            let lp = e.get(0).and_then(Value::as_f64);
            let id = e
                .get(1)
                .and_then(Value::as_u64)
                .and_then(|x| u32::try_from(x).ok());
            match (lp, id) {
                (Some(lp), Some(id)) => {
                    logprobs.push(lp as f32);
                    lp_ids.push(id);
                }
                _ => {
                    return Err(self.http().protocol(
                        route,
                        format!("output_token_logprobs[{i}] is not [logprob, token_id, ...]: {e}"),
                    ))
                }
            }
        }
        let tokens = match v.get("output_ids") {
            Some(ids) => serde_json::from_value::<Vec<u32>>(ids.clone()).map_err(|e| {
                BackendError::Protocol {
                    backend: self.http().name().to_string(),
                    reason: format!("{route}: output_ids"),
                    source: Some(Box::new(e)),
                }
            })?,
            None => lp_ids,
        };
        if tokens.len() != logprobs.len() {
            return Err(self.http().protocol(
                route,
                format!(
                    "{} output ids but {} log-probs",
                    tokens.len(),
                    logprobs.len()
                ),
            ));
        }
        let n = tokens.len();
        let versions = match meta.get("output_token_versions").and_then(Value::as_array) {
            Some(vs) if vs.len() == n => vs
                .iter()
                .map(|x| x.as_u64().map(PolicyVersion))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    self.http()
                        .protocol(route, "output_token_versions are not integers")
                })?,
            _ => {
                let v = meta
                    .get("weight_version")
                    .and_then(crate::server::parse_version)
                    .unwrap_or_else(|| self.common.version.get());
                vec![v; n]
            }
        };
        let kind = match meta.get("finish_reason") {
            Some(Value::Object(o)) => o.get("type").and_then(Value::as_str).map(str::to_string),
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        };
        let finish = match kind.as_deref() {
            Some("stop") => FinishReason::Stop,
            Some("length") => FinishReason::Length,
            Some("abort") => FinishReason::Aborted,
            None if aborted => FinishReason::Aborted,
            other => {
                return Err(self
                    .http()
                    .protocol(route, format!("unknown finish_reason {other:?}")))
            }
        };
        Ok((
            Generated {
                tokens,
                logprobs,
                versions,
            },
            finish,
        ))
    }
}

#[async_trait]
impl Backend for SglangBackend {
    fn name(&self) -> &str {
        self.common.name()
    }

    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        let (mut output, left) = split_resume(&req);
        let Some(left) = left else {
            return Ok(finished(&req, output, FinishReason::Length));
        };
        let ticket = self.common.inflight.register(req.id, self.name())?;
        let rid = format!(
            "rf-{:08x}-{}-{}",
            self.rid_tag,
            req.id.0,
            self.rid_seq.fetch_add(1, Ordering::Relaxed)
        );
        let adapter = self.common.current_adapter();
        let body = self.generate_body(
            &req,
            &output,
            left,
            &rid,
            adapter.as_ref().map(|(n, _)| n.as_str()),
        );
        let call = self.http().post("/generate", &body);
        tokio::pin!(call);
        let mut aborted = false;
        let answer = tokio::select! {
            r = call.as_mut() => r,
            _ = ticket.aborted() => {
                aborted = true;
                self.abort_until_done(&rid, &mut call).await
            }
        };
        drop(ticket);
        let answer = match answer {
            Ok(v) => v,
            // The server went away after we asked to abort: what we know is what we had.
            Err(e) if aborted => {
                tracing::debug!(backend = %self.http().name(), "aborted request failed: {e}");
                return Ok(finished(&req, output, FinishReason::Aborted));
            }
            Err(e) => return Err(e),
        };
        let (mut new, finish) = self.parse_generate(&answer, aborted)?;
        if let Some((_, v)) = adapter {
            // The adapter named is what produced every token of this call.
            new.versions = vec![v; new.tokens.len()];
        }
        output.extend(&new);
        Ok(finished(&req, output, finish))
    }

    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        self.common.inflight.abort(id);
        Ok(())
    }

    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        let mode = match mode {
            PauseMode::Abort => "abort",
            PauseMode::Keep => "in_place",
        };
        self.http()
            .post("/pause_generation", &json!({ "mode": mode }))
            .await
            .map(|_| ())
    }

    async fn resume(&self) -> Result<(), BackendError> {
        self.http()
            .post("/continue_generation", &json!({}))
            .await
            .map(|_| ())
    }

    async fn update_weights(&self, update: &WeightUpdate) -> Result<(), BackendError> {
        if let WeightUpdate::Adapter { dir, name, version } = update {
            return self.load_adapter(dir, name, *version).await;
        }
        let (path, version) = self.common.disk_update(update)?;
        let answer = self
            .http()
            .post(
                "/update_weights_from_disk",
                &json!({
                    "model_path": path.to_string_lossy(),
                    "weight_version": version.0.to_string(),
                }),
            )
            .await?;
        check_success(self.http(), "/update_weights_from_disk", &answer)?;
        super::verify_served_version(self.http(), version).await?;
        self.common.weights_loaded(version);
        Ok(())
    }

    async fn load(&self) -> Result<BackendLoad, BackendError> {
        Ok(self.common.load())
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.http().get("/health").await.map(|_| ())
    }
}

/// SGLang answers some failures with 200 and `{"success": false, "message"}`.
pub(crate) fn check_success(
    http: &HttpClient,
    route: &str,
    answer: &Value,
) -> Result<(), BackendError> {
    if answer.get("success").and_then(Value::as_bool) == Some(false) {
        let msg = answer
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("no message");
        return Err(BackendError::InvalidRequest {
            reason: format!("{} {route}: {msg}", http.name()),
            source: None,
        });
    }
    Ok(())
}
