//! [`OpenAiBackend`]: an OpenAI-compatible server (vLLM, `rollflash serve`, ...) as a
//! [`Backend`], through `POST /v1/completions` with token-id prompts.
//!
//! What is sent: `model`, `prompt` (the prompt ids, then any resumed tokens), `max_tokens`
//! (what is left after the resumed tokens), `temperature`, `top_p`, `top_k` (when on),
//! `seed`, `logprobs: 0` (the sampled token only), and vLLM's extensions `stop_token_ids`,
//! `ignore_eos` (only when there are no stop tokens, as for SGLang), `return_tokens_as_token_ids: true` and
//! `return_token_ids: true`; plus our `rollflash_resumed_len`. vLLM ignores fields it does not
//! know (with a warning).
//!
//! Token ids are recovered from, in order: our `choices[0].rollflash.output_ids`, vLLM's
//! `choices[0].token_ids` (vLLM ≥ 0.10.2 with `return_token_ids`), or the log-prob tokens in
//! vLLM's `"token_id:N"` form (`return_tokens_as_token_ids`). A server offering none of these
//! cannot serve RL and gets a protocol error. Log-probs come from
//! `choices[0].logprobs.token_logprobs`; versions from our `rollflash.versions`, else the last
//! version set through this backend.
//!
//! Limits of the OpenAI API, handled client-side:
//! - There is no abort route: `abort` drops the HTTP request (vLLM and our server abort a
//!   request whose client disconnected). Completions are not streamed, so the aborted request
//!   returns no new tokens: only its resumed part, with `FinishReason::Aborted`.
//! - There is no pause: `pause` holds new requests in the client until `resume`;
//!   `pause(Abort)` also aborts those in flight as above. `pause(Keep)` cannot stop requests
//!   already on the server; they run to completion.
//! - Weights change only through a configured [`WeightHook`].

use std::path::Path;

use async_trait::async_trait;
use rollflash_core::{
    FinishReason, GenOutput, GenRequest, Generated, PolicyVersion, RequestId, SamplingParams,
};
use rollflash_model::chat::ChatMessage;
use serde_json::{json, Value};
use tokio::sync::OnceCell;

use super::common::{finished, ClientPause, HttpCommon};
use super::sglang::check_success;
use super::{request_seed, split_resume, HttpBackendConfig, HttpClient};
use crate::backend::{Backend, BackendError, BackendLoad, PauseMode, WeightUpdate};

/// How an OpenAI-compatible server is told to load new weights: the OpenAI API has no such
/// route, so the deployment decides.
#[derive(Debug, Clone, Default)]
pub enum WeightHook {
    /// Weight updates are refused with `BackendError::Unsupported`.
    #[default]
    None,
    /// `POST route` (relative to the server root) with the body `body(dir, version)` builds;
    /// a non-2xx answer or `{"success": false}` is an error.
    Post {
        route: String,
        body: fn(&Path, PolicyVersion) -> Value,
    },
}

impl WeightHook {
    /// SGLang's and `rollflash serve`'s `POST /update_weights_from_disk`
    /// `{model_path, weight_version}`.
    pub fn update_weights_from_disk() -> Self {
        WeightHook::Post {
            route: "/update_weights_from_disk".into(),
            body: |dir, version| {
                json!({
                    "model_path": dir.to_string_lossy(),
                    "weight_version": version.0.to_string(),
                })
            },
        }
    }
}

/// Settings of an [`OpenAiBackend`].
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    pub http: HttpBackendConfig,
    /// The `model` to request; `None` asks `GET /v1/models` once and takes the first.
    pub model: Option<String>,
    pub weight_hook: WeightHook,
    /// Read token ids and versions from our `rollflash` extension when the server sends it.
    /// Off, only what a plain vLLM server sends is used (for testing that path).
    pub use_extension: bool,
}

impl OpenAiConfig {
    /// Defaults for a server at `base_url`: model from `/v1/models`, no weight hook,
    /// extension used.
    pub fn new(base_url: impl Into<String>) -> Self {
        OpenAiConfig {
            http: HttpBackendConfig::new(base_url),
            model: None,
            weight_hook: WeightHook::None,
            use_extension: true,
        }
    }
}

/// A chat completion: the assistant text and what the server said about its tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatCompletion {
    pub text: String,
    pub finish_reason: FinishReason,
    /// One per output token (from `logprobs.content`).
    pub logprobs: Vec<f32>,
    /// The output token ids, when the server reports them (our extension, or vLLM's
    /// `token_ids`).
    pub token_ids: Option<Vec<u32>>,
}

/// A remote OpenAI-compatible server as a backend.
pub struct OpenAiBackend {
    common: HttpCommon,
    cfg: OpenAiConfig,
    /// The OpenAI API has no pause: requests wait on the client side.
    paused: ClientPause,
    /// The model name, resolved once.
    model: OnceCell<String>,
}

impl std::fmt::Debug for OpenAiBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiBackend")
            .field("name", &self.http().name())
            .finish()
    }
}

impl OpenAiBackend {
    fn http(&self) -> &HttpClient {
        &self.common.http
    }

    /// A backend for the server at `cfg.http.base_url`. Nothing is contacted until the first
    /// call.
    pub fn new(mut cfg: OpenAiConfig) -> Result<Self, BackendError> {
        // Routes are written with their `/v1`; accept the OpenAI-client habit of a base URL
        // that already ends in it.
        let trimmed = cfg.http.base_url.trim_end_matches('/');
        cfg.http.base_url = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string();
        Ok(OpenAiBackend {
            common: HttpCommon::new(&cfg.http)?,
            model: OnceCell::new(),
            paused: ClientPause::new(),
            cfg,
        })
    }

    async fn model(&self) -> Result<&str, BackendError> {
        let m = self
            .model
            .get_or_try_init(|| async {
                if let Some(m) = &self.cfg.model {
                    return Ok(m.clone());
                }
                let list = self.http().get("/v1/models").await?;
                list.pointer("/data/0/id")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| self.http().protocol("/v1/models", "no model listed"))
            })
            .await?;
        Ok(m.as_str())
    }

    /// A chat completion for `messages` (rendered by the server's chat template), with
    /// `logprobs: true`. Waits while the backend is paused; not abortable.
    pub async fn chat(
        &self,
        messages: &[ChatMessage],
        params: &SamplingParams,
    ) -> Result<ChatCompletion, BackendError> {
        self.paused.wait().await;
        let mut body = json!({
            "model": self.model().await?,
            "messages": messages,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": true,
            "return_token_ids": true,
        });
        add_common(&mut body, params);
        if let Some(s) = params.seed {
            body["seed"] = json!(s);
        }
        let route = "/v1/chat/completions";
        let answer = self.http().post(route, &body).await?;
        let choice = answer
            .pointer("/choices/0")
            .ok_or_else(|| self.http().protocol(route, "answer has no choices"))?;
        let text = choice
            .pointer("/message/content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let finish_reason = parse_finish(choice.get("finish_reason"))
            .map_err(|e| self.http().protocol(route, e))?;
        let logprobs = match choice
            .pointer("/logprobs/content")
            .and_then(Value::as_array)
        {
            Some(entries) => entries
                .iter()
                .map(|e| e.get("logprob").and_then(Value::as_f64).map(|x| x as f32))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    self.http()
                        .protocol(route, "a logprobs.content entry has no logprob")
                })?,
            None => Vec::new(),
        };
        let ids =
            |v: Option<&Value>| v.and_then(|v| serde_json::from_value::<Vec<u32>>(v.clone()).ok());
        let token_ids = if self.cfg.use_extension {
            ids(choice.pointer("/rollflash/output_ids")).or_else(|| ids(choice.get("token_ids")))
        } else {
            ids(choice.get("token_ids"))
        };
        Ok(ChatCompletion {
            text,
            finish_reason,
            logprobs,
            token_ids,
        })
    }
}

/// Sampling fields shared by both routes: vLLM's `top_k`, `stop_token_ids`, `ignore_eos`.
fn add_common(body: &mut Value, p: &SamplingParams) {
    if p.top_k > 0 {
        body["top_k"] = json!(p.top_k);
    }
    body["stop_token_ids"] = json!(p.stop_token_ids);
    if p.stop_token_ids.is_empty() {
        body["ignore_eos"] = json!(true);
    }
}

fn parse_finish(v: Option<&Value>) -> Result<FinishReason, String> {
    match v.and_then(Value::as_str) {
        Some("stop") => Ok(FinishReason::Stop),
        Some("length") => Ok(FinishReason::Length),
        Some("abort") => Ok(FinishReason::Aborted),
        // Reasons that end a generation normally on other servers.
        Some("content_filter" | "tool_calls" | "function_call") => Ok(FinishReason::Stop),
        other => Err(format!("unknown finish_reason {other:?}")),
    }
}

/// The first choice of a completion answer.
#[derive(Debug, PartialEq)]
pub(crate) struct ParsedCompletion {
    pub(crate) tokens: Vec<u32>,
    pub(crate) logprobs: Vec<f32>,
    /// Only when the server reported them.
    pub(crate) versions: Option<Vec<PolicyVersion>>,
    pub(crate) finish: FinishReason,
}

/// Reads the first choice of a completion answer (see the module doc for where ids come from).
pub(crate) fn parse_completion(
    answer: &Value,
    use_extension: bool,
) -> Result<ParsedCompletion, String> {
    let choice = answer
        .pointer("/choices/0")
        .ok_or("answer has no choices")?;
    let logprobs: Vec<f32> = match choice.pointer("/logprobs/token_logprobs") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_f64().map(|x| x as f32))
            .collect::<Option<_>>()
            .ok_or("logprobs.token_logprobs has a null or non-number entry")?,
        _ => return Err("answer has no logprobs.token_logprobs (was `logprobs` ignored?)".into()),
    };
    let ids =
        |v: Option<&Value>| v.and_then(|v| serde_json::from_value::<Vec<u32>>(v.clone()).ok());
    let from_ext = if use_extension {
        ids(choice.pointer("/rollflash/output_ids"))
    } else {
        None
    };
    let tokens = match from_ext.or_else(|| ids(choice.get("token_ids"))) {
        Some(t) => t,
        None => {
            let strs = choice
                .pointer("/logprobs/tokens")
                .and_then(Value::as_array)
                .ok_or("answer has neither token ids nor logprobs.tokens")?;
            strs.iter()
                .map(|s| {
                    s.as_str()
                        .and_then(|s| s.strip_prefix("token_id:"))
                        .and_then(|n| n.parse::<u32>().ok())
                })
                .collect::<Option<Vec<u32>>>()
                .ok_or(
                    "cannot recover token ids: the server sent neither `token_ids` nor \
                     `token_id:N` log-prob tokens (vLLM: return_tokens_as_token_ids)",
                )?
        }
    };
    if tokens.len() != logprobs.len() {
        return Err(format!(
            "{} output tokens but {} log-probs",
            tokens.len(),
            logprobs.len()
        ));
    }
    let versions = if use_extension {
        choice
            .pointer("/rollflash/versions")
            .and_then(Value::as_array)
            .and_then(|vs| {
                vs.iter()
                    .map(|v| v.as_u64().map(PolicyVersion))
                    .collect::<Option<Vec<_>>>()
            })
            .filter(|vs| vs.len() == tokens.len())
    } else {
        None
    };
    let finish = parse_finish(choice.get("finish_reason"))?;
    Ok(ParsedCompletion {
        tokens,
        logprobs,
        versions,
        finish,
    })
}

#[async_trait]
impl Backend for OpenAiBackend {
    fn name(&self) -> &str {
        self.common.name()
    }

    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        let (mut output, left) = split_resume(&req);
        let Some(left) = left else {
            return Ok(finished(&req, output, FinishReason::Length));
        };
        let ticket = self.common.inflight.register(req.id, self.name())?;
        if !self.paused.admit(&ticket).await {
            return Ok(finished(&req, output, FinishReason::Aborted));
        }
        let p = &req.params;
        let mut prompt = req.prompt.clone();
        prompt.extend_from_slice(&output.tokens);
        let mut body = json!({
            "model": self.model().await?,
            "prompt": prompt,
            "max_tokens": left,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "seed": request_seed(&req),
            "logprobs": 0,
            "return_tokens_as_token_ids": true,
            "return_token_ids": true,
        });
        add_common(&mut body, p);
        if !output.is_empty() {
            body["rollflash_resumed_len"] = json!(output.len());
        }
        let route = "/v1/completions";
        let answer = tokio::select! {
            r = self.http().post(route, &body) => r?,
            // Dropping the call closes the connection; the server aborts the request.
            _ = ticket.aborted() => return Ok(finished(&req, output, FinishReason::Aborted)),
        };
        drop(ticket);
        let parsed = parse_completion(&answer, self.cfg.use_extension)
            .map_err(|e| self.http().protocol(route, e))?;
        let n = parsed.tokens.len();
        output.extend(&Generated {
            tokens: parsed.tokens,
            logprobs: parsed.logprobs,
            versions: parsed
                .versions
                .unwrap_or_else(|| vec![self.common.version.get(); n]),
        });
        Ok(finished(&req, output, parsed.finish))
    }

    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        self.common.inflight.abort(id);
        Ok(())
    }

    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        self.paused.pause(mode, &self.common.inflight);
        Ok(())
    }

    async fn resume(&self) -> Result<(), BackendError> {
        self.paused.resume();
        Ok(())
    }

    async fn update_weights(&self, update: &WeightUpdate) -> Result<(), BackendError> {
        let (path, version) = self.common.disk_update(update)?;
        let WeightHook::Post { route, body } = &self.cfg.weight_hook else {
            return Err(BackendError::Unsupported {
                backend: self.name().to_string(),
                what: "weight updates: the OpenAI API has none; configure a WeightHook".into(),
            });
        };
        let answer = self.http().post(route, &body(path, version)).await?;
        check_success(self.http(), route, &answer)?;
        super::verify_served_version(self.http(), version).await?;
        self.common.weights_loaded(version);
        Ok(())
    }

    async fn load(&self) -> Result<BackendLoad, BackendError> {
        Ok(self.common.load())
    }

    /// `GET /v1/models`: every OpenAI-compatible server has it (`/health` is vLLM's own).
    async fn health(&self) -> Result<(), BackendError> {
        self.http().get("/v1/models").await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_come_from_vllm_token_id_strings() {
        // A vLLM answer to `return_tokens_as_token_ids: true` without `token_ids`.
        let answer = json!({
            "choices": [{
                "index": 0, "text": "ab", "finish_reason": "length",
                "logprobs": {
                    "tokens": ["token_id:7", "token_id:12"],
                    "token_logprobs": [-0.5, -1.25],
                    "top_logprobs": [{"token_id:7": -0.5}, {"token_id:12": -1.25}],
                    "text_offset": [0, 1]
                }
            }]
        });
        let p = parse_completion(&answer, true).unwrap();
        assert_eq!(p.tokens, vec![7, 12]);
        assert_eq!(p.logprobs, vec![-0.5, -1.25]);
        assert_eq!(p.versions, None);
        assert_eq!(p.finish, FinishReason::Length);
    }

    #[test]
    fn a_server_without_token_ids_is_a_protocol_error() {
        let answer = json!({
            "choices": [{
                "finish_reason": "stop",
                "logprobs": {"tokens": ["a"], "token_logprobs": [-0.1]}
            }]
        });
        let e = parse_completion(&answer, true).unwrap_err();
        assert!(e.contains("return_tokens_as_token_ids"), "{e}");
    }

    #[test]
    fn the_extension_is_ignored_when_off() {
        let answer = json!({
            "choices": [{
                "finish_reason": "stop",
                "token_ids": [3],
                "rollflash": {"output_ids": [9], "versions": [4]},
                "logprobs": {"tokens": ["x"], "token_logprobs": [-0.1]}
            }]
        });
        let p = parse_completion(&answer, false).unwrap();
        assert_eq!((p.tokens, p.versions), (vec![3], None));
        let p = parse_completion(&answer, true).unwrap();
        assert_eq!(
            (p.tokens, p.versions),
            (vec![9], Some(vec![PolicyVersion(4)]))
        );
    }
}
