//! The SGLang-native routes: `/generate` and the control routes an RL trainer uses
//! (pause/continue, abort, update weights from disk, `get_weight_version`), with SGLang's
//! request and response shapes.
//!
//! Extensions (ignored by SGLang clients, used by our `SglangBackend`): `meta_info` carries
//! `output_token_versions` (the policy version of every output token), `weight_version` is
//! always present, `/get_model_info` adds `vocab_size` and `eos_token_ids`, and a request may
//! say `rollflash_resumed_len` to mark the tail of
//! `input_ids` as output of an earlier, aborted attempt.
//!
//! LoRA: `/load_lora_adapter {lora_name, lora_path}` (plus our `rollflash_weight_version`,
//! the version its tokens are labelled with) answers SGLang's `{success, error_message,
//! loaded_adapters}`; `/generate`'s `lora_path` names a loaded adapter.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rollflash_core::{FinishReason, PauseMode, PolicyVersion, SamplingParams};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{reject_unsupported, stop_set, top_k, ApiError, JsonBody, Shared};
use crate::backend::WeightUpdate;

/// `POST /generate` body (SGLang's `GenerateReqInput`, the single-prompt subset).
#[derive(Debug, Deserialize)]
pub(crate) struct GenerateBody {
    /// Prompt as text, tokenized with special tokens as SGLang does.
    #[serde(default)]
    text: Option<String>,
    /// Prompt as token ids; takes precedence over `text`.
    #[serde(default)]
    input_ids: Option<Vec<u32>>,
    #[serde(default)]
    sampling_params: SglSamplingParams,
    /// Adds `output_token_logprobs` to `meta_info`.
    #[serde(default)]
    return_logprob: bool,
    /// The client's id for this request, for `/abort_request`.
    #[serde(default)]
    rid: Option<String>,
    #[serde(default)]
    stream: bool,
    /// Our extension: the last this-many `input_ids` are output of an earlier attempt.
    #[serde(default)]
    rollflash_resumed_len: usize,
    /// The name of a loaded LoRA adapter to generate with (SGLang also takes a path here;
    /// this server takes loaded names only).
    #[serde(default)]
    lora_path: Option<String>,
}

/// SGLang's `sampling_params`, the part this server implements. `sampling_seed` is SGLang's
/// name for the seed; `seed` is accepted too.
#[derive(Debug, Deserialize)]
#[serde(default)]
struct SglSamplingParams {
    temperature: f64,
    top_p: f64,
    top_k: Option<i64>,
    max_new_tokens: usize,
    stop_token_ids: Option<Vec<u32>>,
    #[serde(alias = "seed")]
    sampling_seed: Option<u64>,
    ignore_eos: bool,
    /// Everything else: refused if it would change generation (see `reject_unsupported`),
    /// ignored otherwise (`skip_special_tokens`, `no_stop_trim`, ...).
    #[serde(flatten)]
    extra: Map<String, Value>,
}

impl Default for SglSamplingParams {
    fn default() -> Self {
        SglSamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            // SGLang's default.
            max_new_tokens: 128,
            stop_token_ids: None,
            sampling_seed: None,
            ignore_eos: false,
            extra: Map::new(),
        }
    }
}

pub(crate) async fn generate(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<GenerateBody>,
) -> Result<Json<Value>, ApiError> {
    if body.stream {
        return Err(ApiError::bad_request(
            "streaming is not supported by this server: send \"stream\": false",
        ));
    }
    let sp = body.sampling_params;
    reject_unsupported(&sp.extra, "sampling_params.")?;
    let input_ids = match (body.input_ids, body.text) {
        (Some(ids), _) => ids,
        (None, Some(text)) => shared.encode(&text, true)?,
        (None, None) => {
            return Err(ApiError::bad_request(
                "give the prompt as `input_ids` (token ids) or `text`",
            ))
        }
    };
    if input_ids.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    let params = SamplingParams {
        temperature: sp.temperature,
        top_p: sp.top_p,
        top_k: top_k(sp.top_k),
        max_new_tokens: sp.max_new_tokens,
        stop_token_ids: stop_set(
            &shared,
            sp.stop_token_ids.unwrap_or_default(),
            sp.ignore_eos,
        ),
        seed: sp.sampling_seed,
    };
    let max_new_tokens = params.max_new_tokens;
    let prompt_tokens = input_ids.len();
    let rid = body.rid.clone();
    let t0 = std::time::Instant::now();
    let out = shared
        .generate(
            input_ids,
            params,
            rid.clone(),
            body.rollflash_resumed_len,
            body.lora_path.as_deref(),
        )
        .await?;
    let text = shared.decode(&out.output.tokens)?;
    let finish_reason = match out.finish_reason {
        FinishReason::Stop => {
            json!({ "type": "stop", "matched": out.output.tokens.last().copied() })
        }
        FinishReason::Length => json!({ "type": "length", "length": max_new_tokens }),
        FinishReason::Aborted => json!({ "type": "abort", "message": "aborted" }),
    };
    let weight_version = match out.output.versions.last() {
        Some(v) => *v,
        None => current_version(&shared).await,
    };
    let mut meta = Map::new();
    meta.insert(
        "id".into(),
        json!(rid.unwrap_or_else(|| format!("rf-{}", out.id.0))),
    );
    meta.insert("finish_reason".into(), finish_reason);
    meta.insert("prompt_tokens".into(), json!(prompt_tokens));
    meta.insert("completion_tokens".into(), json!(out.output.len()));
    meta.insert("cached_tokens".into(), json!(0));
    if body.return_logprob {
        let lps: Vec<Value> = out
            .output
            .tokens
            .iter()
            .zip(&out.output.logprobs)
            .map(|(t, lp)| json!([lp, t, Value::Null]))
            .collect();
        meta.insert("output_token_logprobs".into(), Value::Array(lps));
    }
    let versions: Vec<u64> = out.output.versions.iter().map(|v| v.0).collect();
    meta.insert("output_token_versions".into(), json!(versions));
    meta.insert("weight_version".into(), json!(weight_version.0.to_string()));
    meta.insert("e2e_latency".into(), json!(t0.elapsed().as_secs_f64()));
    Ok(Json(json!({
        "text": text,
        "output_ids": out.output.tokens,
        "meta_info": meta,
    })))
}

/// The backend's version, or 0 if it cannot say (only for reporting).
async fn current_version(shared: &Shared) -> PolicyVersion {
    shared
        .backend
        .load()
        .await
        .map(|l| l.version)
        .unwrap_or_default()
}

/// `POST /pause_generation` body.
#[derive(Debug, Deserialize)]
pub(crate) struct PauseBody {
    /// `abort` (default, SGLang's too), `in_place` or `retract`. Both of the latter keep
    /// requests to continue after `/continue_generation`, which is our `Keep`.
    #[serde(default = "default_pause_mode")]
    mode: String,
}

fn default_pause_mode() -> String {
    "abort".into()
}

pub(crate) async fn pause_generation(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<PauseBody>,
) -> Result<Json<Value>, ApiError> {
    let mode = match body.mode.as_str() {
        "abort" => PauseMode::Abort,
        "in_place" | "retract" | "keep" => PauseMode::Keep,
        other => {
            return Err(ApiError::bad_request(format!(
                "mode must be one of \"abort\", \"in_place\", \"retract\"; got {other:?}"
            )))
        }
    };
    for backend in shared.all_backends() {
        backend
            .pause(mode)
            .await
            .map_err(|e| ApiError::from_backend(&e))?;
    }
    Ok(Json(
        json!({ "message": "Generation paused successfully." }),
    ))
}

pub(crate) async fn continue_generation(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<Value>, ApiError> {
    for backend in shared.all_backends() {
        backend
            .resume()
            .await
            .map_err(|e| ApiError::from_backend(&e))?;
    }
    Ok(Json(
        json!({ "message": "Generation continued successfully." }),
    ))
}

/// `POST /abort_request` body.
#[derive(Debug, Deserialize)]
pub(crate) struct AbortBody {
    #[serde(default)]
    rid: Option<String>,
    #[serde(default)]
    abort_all: bool,
}

/// Aborts by `rid`, or everything with `abort_all`. Unknown rids are ignored, as SGLang does.
pub(crate) async fn abort_request(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<AbortBody>,
) -> Result<Json<Value>, ApiError> {
    let ids = if body.abort_all {
        shared.inflight_ids()
    } else {
        let rid = body
            .rid
            .ok_or_else(|| ApiError::bad_request("give `rid` or `abort_all: true`"))?;
        shared.lookup_rid(&rid).into_iter().collect()
    };
    for backend in shared.all_backends() {
        for id in &ids {
            backend
                .abort(*id)
                .await
                .map_err(|e| ApiError::from_backend(&e))?;
        }
    }
    Ok(Json(json!({ "aborted": ids.len() })))
}

/// `POST /update_weights_from_disk` body.
#[derive(Debug, Deserialize)]
pub(crate) struct UpdateWeightsBody {
    model_path: String,
    /// SGLang sends a string; integers are accepted. Absent: one more than the current one.
    #[serde(default)]
    weight_version: Option<Value>,
    /// Only the default loader exists here.
    #[serde(default)]
    load_format: Option<String>,
    /// SGLang's option to abort in-flight requests first.
    #[serde(default)]
    abort_all_requests: bool,
}

/// Answers SGLang's `{success, message}` and, on failure, also our `error` object so both
/// kinds of clients find the reason.
pub(crate) async fn update_weights_from_disk(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<UpdateWeightsBody>,
) -> Response {
    match update_weights(&shared, body).await {
        Ok((version, path)) => Json(json!({
            "success": true,
            "message": format!("Succeeded to update model weights from {}.", path.display()),
            "num_paused_requests": 0,
            "weight_version": version.0.to_string(),
        }))
        .into_response(),
        Err(e) => {
            tracing::warn!(status = %e.status, "update_weights_from_disk failed: {}", e.message);
            let mut body = e.body();
            body.insert("success".into(), json!(false));
            body.insert("message".into(), json!(e.message));
            (e.status, Json(Value::Object(body))).into_response()
        }
    }
}

async fn update_weights(
    shared: &Arc<Shared>,
    body: UpdateWeightsBody,
) -> Result<(PolicyVersion, std::path::PathBuf), ApiError> {
    if let Some(f) = body.load_format.as_deref() {
        if f != "auto" {
            return Err(ApiError::bad_request(format!(
                "load_format {f:?} is not supported (only \"auto\")"
            )));
        }
    }
    let path = shared.resolve_weights_dir(&body.model_path)?;
    let version = match &body.weight_version {
        None | Some(Value::Null) => current_version(shared).await.next(),
        Some(v) => parse_version(v).ok_or_else(|| {
            ApiError::bad_request(format!(
                "weight_version must be a non-negative integer (or its decimal string), got {v}"
            ))
        })?,
    };
    if body.abort_all_requests {
        for id in shared.inflight_ids() {
            shared
                .backend
                .abort(id)
                .await
                .map_err(|e| ApiError::from_backend(&e))?;
        }
    }
    let update = WeightUpdate::Disk {
        path: path.clone(),
        version,
    };
    tracing::info!(path = %path.display(), %version, "updating weights from disk");
    shared.backend.update_weights(&update).await.map_err(|e| {
        // A checkpoint that does not load is the request's fault, not the server's.
        let mut err = ApiError::from_backend(&e);
        if matches!(e, crate::backend::BackendError::Engine(_)) {
            err.status = StatusCode::BAD_REQUEST;
        }
        err
    })?;
    Ok((version, path))
}

/// `POST /load_lora_adapter` body (SGLang's `LoadLoRAAdapterReqInput`).
#[derive(Debug, Deserialize)]
pub(crate) struct LoadLoraBody {
    lora_name: String,
    lora_path: String,
    /// Our extension: the policy version the adapter's tokens are labelled with.
    #[serde(default)]
    rollflash_weight_version: Option<Value>,
}

/// `POST /unload_lora_adapter` body.
#[derive(Debug, Deserialize)]
pub(crate) struct UnloadLoraBody {
    lora_name: String,
}

/// SGLang's answer to the adapter routes: `{success, error_message, loaded_adapters}`, with
/// our `error` object too on failure.
fn lora_answer(shared: &Shared, result: Result<(), ApiError>) -> Response {
    let loaded: Map<String, Value> = shared
        .adapter_list()
        .into_iter()
        .map(|(n, p)| (n, json!(p.to_string_lossy())))
        .collect();
    match result {
        Ok(()) => Json(json!({
            "success": true,
            "error_message": "",
            "loaded_adapters": loaded,
        }))
        .into_response(),
        Err(e) => {
            let mut body = e.body();
            body.insert("success".into(), json!(false));
            body.insert("error_message".into(), json!(e.message));
            body.insert("loaded_adapters".into(), Value::Object(loaded));
            (e.status, Json(Value::Object(body))).into_response()
        }
    }
}

pub(crate) async fn load_lora_adapter(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<LoadLoraBody>,
) -> Response {
    let result = async {
        let version = match &body.rollflash_weight_version {
            None | Some(Value::Null) => None,
            Some(v) => Some(parse_version(v).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "rollflash_weight_version must be a non-negative integer, got {v}"
                ))
            })?),
        };
        shared
            .load_adapter(&body.lora_name, &body.lora_path, version)
            .await
    }
    .await;
    lora_answer(&shared, result)
}

pub(crate) async fn unload_lora_adapter(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<UnloadLoraBody>,
) -> Response {
    let result = shared.unload_adapter(&body.lora_name);
    lora_answer(&shared, result)
}

/// A version as SGLang (string) or a program (integer) sends it.
pub(crate) fn parse_version(v: &Value) -> Option<PolicyVersion> {
    match v {
        Value::Number(n) => n.as_u64().map(PolicyVersion),
        Value::String(s) => s.trim().parse().ok().map(PolicyVersion),
        _ => None,
    }
}

/// Nothing is cached across requests here (no prefix cache), so there is nothing to flush.
pub(crate) async fn flush_cache() -> Json<Value> {
    Json(json!({ "success": true, "message": "Cache flushed (no prefix cache to flush)." }))
}

pub(crate) async fn get_model_info(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<Value>, ApiError> {
    let load = shared
        .backend
        .load()
        .await
        .map_err(|e| ApiError::from_backend(&e))?;
    Ok(Json(json!({
        "model_path": shared.cfg.model_name,
        "tokenizer_path": shared.cfg.model_name,
        "is_generation": true,
        "preferred_sampling_params": Value::Null,
        "weight_version": load.version.0.to_string(),
        "has_chat_template": shared.chat_template.is_some(),
        // Ours (SGLang reports neither): what a trainer checks its model against.
        "vocab_size": shared.cfg.vocab_size,
        "eos_token_ids": shared.cfg.eos_token_ids,
    })))
}

/// SGLang's `GET /get_weight_version`: `{"weight_version": "N"}`, the version of the
/// weights generation uses now (what a trainer reads back after a load to verify it).
pub(crate) async fn get_weight_version(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<Value>, ApiError> {
    // Not `current_version`: a version read back to verify a load must not default to 0.
    let load = shared
        .backend
        .load()
        .await
        .map_err(|e| ApiError::from_backend(&e))?;
    Ok(Json(
        json!({ "weight_version": load.version.0.to_string() }),
    ))
}

pub(crate) async fn get_server_info(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<Value>, ApiError> {
    let load = shared
        .backend
        .load()
        .await
        .map_err(|e| ApiError::from_backend(&e))?;
    Ok(Json(json!({
        "server": "rollflash",
        "version": env!("CARGO_PKG_VERSION"),
        "model_path": shared.cfg.model_name,
        "backend": shared.backend.name(),
        "weight_version": load.version.0.to_string(),
        "num_running_reqs": load.running,
        "num_waiting_reqs": load.waiting,
        "max_body_bytes": shared.cfg.max_body_bytes,
    })))
}

/// Liveness: 200 with an empty body, as SGLang answers, when the backend is healthy.
pub(crate) async fn health(State(shared): State<Arc<Shared>>) -> Result<StatusCode, ApiError> {
    shared
        .backend
        .health()
        .await
        .map_err(|e| ApiError::from_backend(&e))?;
    Ok(StatusCode::OK)
}
