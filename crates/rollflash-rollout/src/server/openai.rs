//! The OpenAI-compatible routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models`,
//! non-streaming, in the shapes the official `openai` client parses.
//!
//! vLLM extensions understood: `stop_token_ids`, `ignore_eos`, `top_k`,
//! `return_tokens_as_token_ids` (log-prob tokens as `"token_id:N"`) and `return_token_ids`
//! (`token_ids` on each choice). Our own: every choice carries
//! `"rollflash": {"output_ids", "versions"}`, and a request may say `rollflash_resumed_len`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use rollflash_core::{FinishReason, GenOutput, SamplingParams};
use rollflash_model::chat::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{reject_unsupported, stop_set, top_k, ApiError, JsonBody, Shared};

/// The prompt of a completion: text or token ids, one or a batch.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenBatch(Vec<Vec<u32>>),
}

/// `POST /v1/completions` body.
#[derive(Debug, Deserialize)]
pub(crate) struct CompletionBody {
    #[serde(default)]
    model: Option<String>,
    prompt: Prompt,
    /// OpenAI's default is 16.
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    top_k: Option<i64>,
    /// Choices per prompt; each gets its own request (and seed `seed + i`).
    #[serde(default)]
    n: Option<usize>,
    /// OpenAI allows 0..=5 alternatives; we return the sampled token's log-prob only.
    #[serde(default)]
    logprobs: Option<u32>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    ignore_eos: bool,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    return_tokens_as_token_ids: bool,
    #[serde(default)]
    return_token_ids: bool,
    #[serde(default)]
    rollflash_resumed_len: usize,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

pub(crate) async fn completions(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<CompletionBody>,
) -> Result<Json<Value>, ApiError> {
    check_common(&shared, body.model.as_deref(), body.stream, &body.extra)?;
    let prompts: Vec<Vec<u32>> = match body.prompt {
        Prompt::Text(t) => vec![shared.encode(&t, true)?],
        Prompt::Tokens(ids) => vec![ids],
        Prompt::Texts(ts) => ts
            .iter()
            .map(|t| shared.encode(t, true))
            .collect::<Result<_, _>>()?,
        Prompt::TokenBatch(b) => b,
    };
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::bad_request("prompt must not be empty"));
    }
    if body.logprobs.is_some_and(|k| k > 5) {
        return Err(ApiError::bad_request("logprobs must be between 0 and 5"));
    }
    let n = choices_per_prompt(body.n)?;
    let base = SamplingParams {
        temperature: body.temperature.unwrap_or(1.0),
        top_p: body.top_p.unwrap_or(1.0),
        top_k: top_k(body.top_k),
        max_new_tokens: body.max_tokens.unwrap_or(16),
        stop_token_ids: stop_set(
            &shared,
            body.stop_token_ids.unwrap_or_default(),
            body.ignore_eos,
        ),
        seed: body.seed,
    };
    let mut jobs = Vec::new();
    for p in &prompts {
        for i in 0..n {
            let mut params = base.clone();
            params.seed = base.seed.map(|s| s.wrapping_add(i as u64));
            jobs.push(shared.generate(p.clone(), params, None, body.rollflash_resumed_len));
        }
    }
    let outs = futures::future::try_join_all(jobs).await?;
    let mut choices = Vec::with_capacity(outs.len());
    let mut usage = Usage {
        prompt: prompts.iter().map(Vec::len).sum(),
        completion: 0,
    };
    for (index, out) in outs.iter().enumerate() {
        usage.completion += out.output.len();
        let text = shared.decode(&out.output.tokens)?;
        let mut choice = Map::new();
        choice.insert("index".into(), json!(index));
        choice.insert("text".into(), json!(text));
        let logprobs = match body.logprobs {
            None => Value::Null,
            Some(_) => {
                let tokens = token_strings(&shared, out, body.return_tokens_as_token_ids);
                let mut offsets = Vec::with_capacity(tokens.len());
                let mut at = 0usize;
                for t in &tokens {
                    offsets.push(at);
                    at += t.chars().count();
                }
                json!({
                    "tokens": tokens,
                    "token_logprobs": out.output.logprobs,
                    "top_logprobs": Value::Null,
                    "text_offset": offsets,
                })
            }
        };
        choice.insert("logprobs".into(), logprobs);
        choice.insert(
            "finish_reason".into(),
            json!(finish_reason(out.finish_reason)),
        );
        extensions(&mut choice, out, body.return_token_ids);
        choices.push(Value::Object(choice));
    }
    Ok(Json(json!({
        "id": format!("cmpl-{}", outs.first().map_or(0, |o| o.id.0)),
        "object": "text_completion",
        "created": now(),
        "model": shared.cfg.model_name,
        "choices": choices,
        "usage": usage.json(),
    })))
}

/// A chat message's content: a string, or OpenAI's list of parts of which only text is
/// supported.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

/// `POST /v1/chat/completions` body.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatBody {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<MessageIn>,
    #[serde(default)]
    max_tokens: Option<usize>,
    /// OpenAI's newer name for `max_tokens`.
    #[serde(default)]
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    n: Option<usize>,
    #[serde(default)]
    logprobs: bool,
    /// Alternatives per token; we list none (`top_logprobs: []`), so only 0 is honoured
    /// exactly, larger values are accepted and answered with empty lists.
    #[serde(default)]
    top_logprobs: Option<u32>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    ignore_eos: bool,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    return_token_ids: bool,
    /// Generation continues the last (assistant) message instead of opening a new one.
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

pub(crate) async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<ChatBody>,
) -> Result<Json<Value>, ApiError> {
    check_common(&shared, body.model.as_deref(), body.stream, &body.extra)?;
    if body.top_logprobs.is_some_and(|k| k > 20) {
        return Err(ApiError::bad_request(
            "top_logprobs must be between 0 and 20",
        ));
    }
    let template = shared.chat_template.as_ref().ok_or_else(|| {
        ApiError::bad_request("this model has no chat template: use /v1/completions")
    })?;
    if body.messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty"));
    }
    let mut messages = Vec::with_capacity(body.messages.len());
    for (i, m) in body.messages.into_iter().enumerate() {
        let content = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(ApiError::bad_request(format!(
                            "messages[{i}].content: only text parts are supported, got {:?}",
                            p.kind
                        )));
                    }
                    s.push_str(p.text.as_deref().unwrap_or_default());
                }
                s
            }
        };
        messages.push(ChatMessage::new(m.role, content));
    }
    let text = template
        .render(&messages, body.add_generation_prompt.unwrap_or(true))
        .map_err(|e| {
            ApiError::bad_request(format!(
                "cannot render the chat template: {}",
                super::error_chain(&e)
            ))
        })?;
    // The template already wrote any special tokens the model expects.
    let prompt = shared.encode(&text, false)?;
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the rendered prompt is empty"));
    }
    let n = choices_per_prompt(body.n)?;
    let base = SamplingParams {
        temperature: body.temperature.unwrap_or(1.0),
        top_p: body.top_p.unwrap_or(1.0),
        top_k: top_k(body.top_k),
        max_new_tokens: body
            .max_completion_tokens
            .or(body.max_tokens)
            .unwrap_or(shared.cfg.default_chat_max_tokens),
        stop_token_ids: stop_set(
            &shared,
            body.stop_token_ids.unwrap_or_default(),
            body.ignore_eos,
        ),
        seed: body.seed,
    };
    let jobs = (0..n).map(|i| {
        let mut params = base.clone();
        params.seed = base.seed.map(|s| s.wrapping_add(i as u64));
        shared.generate(prompt.clone(), params, None, 0)
    });
    let outs = futures::future::try_join_all(jobs).await?;
    let mut choices = Vec::with_capacity(outs.len());
    let mut usage = Usage {
        prompt: prompt.len(),
        completion: 0,
    };
    for (index, out) in outs.iter().enumerate() {
        usage.completion += out.output.len();
        let content = shared.decode(&out.output.tokens)?;
        let logprobs = if body.logprobs {
            let entries: Vec<Value> = out
                .output
                .tokens
                .iter()
                .zip(&out.output.logprobs)
                .map(|(&t, lp)| {
                    let token = shared.token_text(t);
                    json!({
                        "token": token,
                        "logprob": lp,
                        "bytes": token.as_bytes(),
                        "top_logprobs": [],
                    })
                })
                .collect();
            json!({ "content": entries })
        } else {
            Value::Null
        };
        let mut choice = Map::new();
        choice.insert("index".into(), json!(index));
        choice.insert(
            "message".into(),
            json!({ "role": "assistant", "content": content }),
        );
        choice.insert("logprobs".into(), logprobs);
        choice.insert(
            "finish_reason".into(),
            json!(finish_reason(out.finish_reason)),
        );
        extensions(&mut choice, out, body.return_token_ids);
        choices.push(Value::Object(choice));
    }
    Ok(Json(json!({
        "id": format!("chatcmpl-{}", outs.first().map_or(0, |o| o.id.0)),
        "object": "chat.completion",
        "created": now(),
        "model": shared.cfg.model_name,
        "choices": choices,
        "usage": usage.json(),
    })))
}

/// `GET /v1/models`: the one model served.
pub(crate) async fn models(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": shared.cfg.model_name,
            "object": "model",
            "created": shared.created,
            "owned_by": "rollflash",
        }],
    }))
}

/// Checks shared by both routes: the model name, no streaming, no unsupported sampling.
fn check_common(
    shared: &Shared,
    model: Option<&str>,
    stream: bool,
    extra: &Map<String, Value>,
) -> Result<(), ApiError> {
    if let Some(m) = model {
        if m != shared.cfg.model_name {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "The model `{m}` does not exist: this server serves `{}`",
                    shared.cfg.model_name
                ),
            ));
        }
    }
    if stream {
        return Err(ApiError::bad_request(
            "streaming is not supported by this server: send \"stream\": false",
        ));
    }
    // `n` is handled by the routes; the list's entry for it is for SGLang's sampling_params.
    let mut extra = extra.clone();
    extra.remove("n");
    reject_unsupported(&extra, "")
}

/// `n` within a sane bound: each choice is a full generation.
fn choices_per_prompt(n: Option<usize>) -> Result<usize, ApiError> {
    match n.unwrap_or(1) {
        0 => Err(ApiError::bad_request("n must be at least 1")),
        n if n > 128 => Err(ApiError::bad_request("n must be at most 128")),
        n => Ok(n),
    }
}

/// Log-prob token strings: each token's text, or vLLM's `"token_id:N"` when asked, which
/// lets a client recover ids from a plain OpenAI response.
fn token_strings(shared: &Shared, out: &GenOutput, as_ids: bool) -> Vec<String> {
    out.output
        .tokens
        .iter()
        .map(|&t| {
            if as_ids {
                format!("token_id:{t}")
            } else {
                shared.token_text(t)
            }
        })
        .collect()
}

/// Our extension (ids and versions) on every choice, and vLLM's `token_ids` when asked.
fn extensions(choice: &mut Map<String, Value>, out: &GenOutput, return_token_ids: bool) {
    let versions: Vec<u64> = out.output.versions.iter().map(|v| v.0).collect();
    choice.insert(
        "rollflash".into(),
        json!({ "output_ids": out.output.tokens, "versions": versions }),
    );
    if return_token_ids {
        choice.insert("token_ids".into(), json!(out.output.tokens));
    }
}

/// OpenAI's finish reasons; an aborted generation says `abort`, as vLLM does.
fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Aborted => "abort",
    }
}

/// Token counts of a response: prompts once each, every choice's output.
struct Usage {
    prompt: usize,
    completion: usize,
}

impl Usage {
    fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
        })
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
