//! The JSON part of the Tinker protocol: request and reply bodies of every call except the
//! protobuf `forward_backward` body and the protobuf results (`proto.rs`), and the error
//! bodies servers send.
//!
//! Shapes are the tinker SDK 0.25 dialect as SkyRL 0.4.0 reads it (`skyrl/tinker/api.py`).
//! Requests carry the SDK's `type` tags, which SkyRL ignores and hosted Tinker may route on.
//! Replies are parsed leniently (unknown fields ignored, most fields optional), so TuFT's
//! and hosted Tinker's replies parse too.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The SDK version we speak the dialect of, sent in `create_session`.
pub const SDK_VERSION: &str = "0.25.0";

/// `POST /api/v1/create_session`.
#[derive(Clone, Debug, Serialize)]
pub struct CreateSessionRequest {
    pub tags: Vec<String>,
    pub user_metadata: BTreeMap<String, String>,
    pub sdk_version: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The reply to `create_session`.
#[derive(Clone, Debug, Deserialize)]
pub struct CreateSessionResponse {
    pub session_id: String,
    #[serde(default)]
    pub info_message: Option<String>,
    #[serde(default)]
    pub warning_message: Option<String>,
    #[serde(default)]
    pub error_message: Option<String>,
}

/// `POST /api/v1/session_heartbeat`: keeps a session alive (SkyRL drops sessions without
/// one for `--session-timeout-sec`, 300 s by default).
#[derive(Clone, Debug, Serialize)]
pub struct SessionHeartbeatRequest {
    pub session_id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// `GET /api/v1/get_server_capabilities`.
#[derive(Clone, Debug, Deserialize)]
pub struct ServerCapabilities {
    #[serde(default)]
    pub supported_models: Vec<SupportedModel>,
}

/// A model the server serves; SkyRL names it by its exact `--base-model` string.
#[derive(Clone, Debug, Deserialize)]
pub struct SupportedModel {
    #[serde(default)]
    pub model_name: Option<String>,
}

/// LoRA settings of `create_model`. SkyRL uses only `rank` and `seed` (alpha is fixed at 32,
/// and it reports `train_unembed: false` whatever is asked).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LoraConfig {
    pub rank: u32,
    /// Seeds the adapter's initialisation; SkyRL picks a random one when it is absent.
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default = "yes")]
    pub train_unembed: bool,
    #[serde(default = "yes")]
    pub train_mlp: bool,
    #[serde(default = "yes")]
    pub train_attn: bool,
}

fn yes() -> bool {
    true
}

impl LoraConfig {
    /// A rank-`rank` adapter on attention, MLP and unembedding, seeded.
    pub fn new(rank: u32, seed: Option<i64>) -> LoraConfig {
        LoraConfig {
            rank,
            seed,
            train_unembed: true,
            train_mlp: true,
            train_attn: true,
        }
    }
}

/// `POST /api/v1/create_model`.
#[derive(Clone, Debug, Serialize)]
pub struct CreateModelRequest {
    pub session_id: String,
    /// The client's counter of models in this session.
    pub model_seq_id: u32,
    /// SkyRL ignores it and trains its own `--base-model`.
    pub base_model: String,
    pub lora_config: LoraConfig,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The result of the create_model future.
#[derive(Clone, Debug, Deserialize)]
pub struct CreateModelResult {
    pub model_id: String,
    #[serde(default)]
    pub base_model: Option<String>,
    #[serde(default)]
    pub lora_config: Option<serde_json::Value>,
}

/// The reply to a call that queues work: the future to retrieve. SkyRL sends `future_id`,
/// `status` and `request_id`; TuFT sends only `request_id` (and `model_id` for
/// create_model), with HTTP 202.
#[derive(Clone, Debug, Deserialize)]
pub struct FuturePending {
    pub request_id: String,
    #[serde(default)]
    pub future_id: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub model_id: Option<String>,
}

/// `POST /api/v1/get_info`.
#[derive(Clone, Debug, Serialize)]
pub struct GetInfoRequest {
    pub model_id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The reply to `get_info`.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelInfo {
    pub model_id: String,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub model_data: Option<ModelData>,
}

/// What `get_info` says about a model.
#[derive(Clone, Debug, Deserialize)]
pub struct ModelData {
    #[serde(default)]
    pub base_model: Option<String>,
    #[serde(default)]
    pub model_name: Option<String>,
    #[serde(default)]
    pub lora_config: Option<serde_json::Value>,
}

/// Adam(W) settings of one `optim_step`. The server keeps the moments between steps; the
/// hyper-parameters are sent every step.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AdamParams {
    pub learning_rate: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// 0 = no clipping. SkyRL 0.4.0 ignores it (its AdamParams has no such field).
    pub grad_clip_norm: f64,
}

impl AdamParams {
    /// The SDK's defaults (beta2 0.95, eps 1e-12, no weight decay or clipping) at `lr`.
    pub fn with_lr(learning_rate: f64) -> AdamParams {
        AdamParams {
            learning_rate,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-12,
            weight_decay: 0.0,
            grad_clip_norm: 0.0,
        }
    }
}

/// `POST /api/v1/optim_step`.
#[derive(Clone, Debug, Serialize)]
pub struct OptimStepRequest {
    pub model_id: String,
    pub seq_id: i32,
    pub adam_params: AdamParams,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The result of the optim_step future: SkyRL reports `skyrl.ai/grad_norm` and
/// `skyrl.ai/learning_rate`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct OptimStepResult {
    /// SkyRL's `OptimStepOutput.metrics` may be null.
    #[serde(default)]
    pub metrics: Option<BTreeMap<String, f64>>,
}

/// `POST /api/v1/save_weights_for_sampler` (by name) and `POST /api/v1/save_weights`
/// (training state: weights and optimizer).
#[derive(Clone, Debug, Serialize)]
pub struct SaveWeightsRequest {
    pub model_id: String,
    /// A name, `^[a-zA-Z0-9_-]+$`, at most 255 characters (SkyRL checks this).
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_id: Option<i32>,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The result of save_weights_for_sampler / save_weights: the `tinker://` path.
#[derive(Clone, Debug, Deserialize)]
pub struct SaveWeightsResult {
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub sampling_session_id: Option<String>,
}

/// `POST /api/v1/load_weights`: only a fresh model's first request (SkyRL answers 400
/// otherwise).
#[derive(Clone, Debug, Serialize)]
pub struct LoadWeightsRequest {
    pub model_id: String,
    /// `tinker://<model>/weights/<name>`, as save_weights returned it.
    pub path: String,
    /// Whether the Adam moments come back too.
    pub optimizer: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_id: Option<i32>,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// `POST /api/v1/create_sampling_session`: exactly one of `model_path` and `base_model`.
#[derive(Clone, Debug, Serialize)]
pub struct CreateSamplingSessionRequest {
    pub session_id: String,
    pub sampling_session_seq_id: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_model: Option<String>,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The reply to `create_sampling_session`.
#[derive(Clone, Debug, Deserialize)]
pub struct CreateSamplingSessionResponse {
    pub sampling_session_id: String,
}

/// A text chunk of a JSON model input.
#[derive(Clone, Debug, Serialize)]
pub struct EncodedTextChunk {
    pub tokens: Vec<i32>,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// A JSON model input (the prompt of `asample`).
#[derive(Clone, Debug, Serialize)]
pub struct ModelInput {
    pub chunks: Vec<EncodedTextChunk>,
}

impl ModelInput {
    /// One chunk of token ids.
    pub fn tokens(tokens: Vec<i32>) -> ModelInput {
        ModelInput {
            chunks: vec![EncodedTextChunk {
                tokens,
                kind: "encoded_text",
            }],
        }
    }
}

/// Sampling settings of `asample`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SamplingParams {
    pub max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Stop token ids (the protocol also allows strings; we speak token ids).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<i32>,
    pub temperature: f64,
    /// -1 = off.
    pub top_k: i32,
    pub top_p: f64,
}

/// `POST /api/v1/asample`.
#[derive(Clone, Debug, Serialize)]
pub struct SampleRequest {
    pub num_samples: u32,
    pub prompt: ModelInput,
    pub sampling_params: SamplingParams,
    pub sampling_session_id: String,
    /// SkyRL requires one with a sampling session; it is not an idempotency key here.
    pub seq_id: i32,
    pub prompt_logprobs: bool,
    pub topk_prompt_logprobs: u32,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// `POST /api/v1/retrieve_future`.
#[derive(Clone, Debug, Serialize)]
pub struct RetrieveFutureRequest {
    pub request_id: String,
    /// false: we want the payload, not a `complete_metadata` peek at its size.
    pub allow_metadata_only: bool,
}

/// A JSON reply of `retrieve_future` that is not a result: a failed request
/// (`RequestFailedResponse`), a `try_again`, or a metadata-only peek. SkyRL sends none of
/// these (its failures are HTTP 400 `{detail}`); hosted Tinker and the SDK know them.
#[derive(Clone, Debug, Deserialize)]
pub struct FutureControl {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    /// Set on a failed request.
    #[serde(default)]
    pub error: Option<serde_json::Value>,
    /// `unknown` | `server` | `user` on a failed request.
    #[serde(default)]
    pub category: Option<String>,
    /// `active` | `paused_capacity` | `paused_rate_limit` on a try_again.
    #[serde(default)]
    pub queue_state: Option<String>,
}

impl FutureControl {
    /// Whether the server asks to poll again.
    pub fn is_try_again(&self) -> bool {
        self.kind.as_deref() == Some("try_again")
    }

    /// Whether the reply is only the size of a finished result.
    pub fn is_metadata_only(&self) -> bool {
        self.status.as_deref() == Some("complete_metadata")
    }
}

/// FastAPI's error body: `{"detail": "text"}`, or a list of validation errors for 422.
#[derive(Clone, Debug, Deserialize)]
pub struct ErrorBody {
    pub detail: serde_json::Value,
}

/// A JSON `TensorData` (the older all-JSON dialect of forward results).
#[derive(Clone, Debug, Deserialize)]
pub struct TensorData {
    pub data: Vec<f64>,
    #[serde(default)]
    pub dtype: Option<String>,
    #[serde(default)]
    pub shape: Option<Vec<i64>>,
}

/// A forward/forward_backward result as JSON (the older dialect; SkyRL 0.4.0 sends protobuf).
#[derive(Clone, Debug, Deserialize)]
pub struct ForwardBackwardJson {
    #[serde(default)]
    pub loss_fn_output_type: Option<String>,
    pub loss_fn_outputs: Vec<BTreeMap<String, TensorData>>,
    #[serde(default)]
    pub metrics: BTreeMap<String, Option<f64>>,
}

/// A sampled sequence as JSON (the older dialect).
#[derive(Clone, Debug, Deserialize)]
pub struct SampledSequenceJson {
    pub tokens: Vec<i32>,
    #[serde(default)]
    pub logprobs: Option<Vec<f32>>,
    #[serde(default)]
    pub stop_reason: Option<String>,
}

/// A sample result as JSON (the older dialect).
#[derive(Clone, Debug, Deserialize)]
pub struct SampleJson {
    pub sequences: Vec<SampledSequenceJson>,
    /// Undefined entries (the first prompt token) are null.
    #[serde(default)]
    pub prompt_logprobs: Option<Vec<Option<f32>>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_model_request_is_the_sdk_shape() {
        let req = CreateModelRequest {
            session_id: "s".into(),
            model_seq_id: 0,
            base_model: "m".into(),
            lora_config: LoraConfig::new(8, Some(0)),
            kind: "create_model",
        };
        assert_eq!(
            serde_json::to_value(&req).unwrap(),
            serde_json::json!({"session_id":"s","model_seq_id":0,"base_model":"m",
                "lora_config":{"rank":8,"seed":0,"train_unembed":true,"train_mlp":true,"train_attn":true},
                "type":"create_model"})
        );
    }

    #[test]
    fn future_replies_of_skyrl_and_tuft_parse() {
        let skyrl: FuturePending =
            serde_json::from_str(r#"{"future_id":"2","status":"pending","request_id":"2"}"#)
                .unwrap();
        assert_eq!(skyrl.request_id, "2");
        let tuft: FuturePending =
            serde_json::from_str(r#"{"request_id":"9f1c","model_id":"a-b"}"#).unwrap();
        assert_eq!(tuft.model_id.as_deref(), Some("a-b"));
        assert!(tuft.future_id.is_none());
    }

    #[test]
    fn control_replies_are_recognised() {
        let t: FutureControl =
            serde_json::from_str(r#"{"type":"try_again","request_id":"1","queue_state":"active"}"#)
                .unwrap();
        assert!(t.is_try_again());
        let f: FutureControl =
            serde_json::from_str(r#"{"error":"boom","category":"user"}"#).unwrap();
        assert!(f.error.is_some() && !f.is_try_again());
        let m: FutureControl =
            serde_json::from_str(r#"{"status":"complete_metadata","response_payload_size":9}"#)
                .unwrap();
        assert!(m.is_metadata_only());
    }

    #[test]
    fn sample_request_leaves_out_empty_stop_and_seed() {
        let req = SampleRequest {
            num_samples: 2,
            prompt: ModelInput::tokens(vec![5, 17]),
            sampling_params: SamplingParams {
                max_tokens: 8,
                seed: None,
                stop: vec![],
                temperature: 0.0,
                top_k: -1,
                top_p: 1.0,
            },
            sampling_session_id: "x".into(),
            seq_id: 1,
            prompt_logprobs: false,
            topk_prompt_logprobs: 0,
            kind: "sample",
        };
        let v = serde_json::to_value(&req).unwrap();
        assert_eq!(
            v["prompt"],
            serde_json::json!({"chunks":[{"tokens":[5,17],"type":"encoded_text"}]})
        );
        assert!(v["sampling_params"].get("stop").is_none());
        assert!(v["sampling_params"].get("seed").is_none());
    }
}
