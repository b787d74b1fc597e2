//! The OpenAI-compatible routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models`, in
//! the shapes the official `openai` client parses, as vLLM serves them.
//!
//! Supported beyond plain sampling:
//! - `stream: true` on both routes: server-sent events (`data: {chunk}` … `data: [DONE]`), a
//!   chat stream opening with the assistant role, and with `stream_options.include_usage` a
//!   last chunk with empty `choices` and the `usage`. Tokens are sent as the backend samples
//!   them where it streams (the embedded engine does); HTTP backends and requests asking for
//!   top log-prob alternatives send everything when the generation ends.
//! - `stop` (a string or a list): the text is cut before the earliest match (kept with vLLM's
//!   `include_stop_str_in_output`), `finish_reason: "stop"`, `stop_reason` names the string,
//!   and the generation is aborted as soon as a match appears. Streams hold back the last
//!   `longest stop − 1` characters until they are settled.
//! - `echo` on completions: the prompt's text before the completion's (`max_tokens: 0` returns
//!   only the prompt), with prompt log-probs when `logprobs` is set (the first is `null`).
//! - `logprobs: k` on completions (0..=20): `top_logprobs` lists the sampled token and the `k`
//!   most likely; `logprobs: true` with `top_logprobs: k` on chat. Alternatives are scored by
//!   the backend (`Backend::score`, the embedded engine) under `log_softmax(logits / T)`, the
//!   distribution the sampled tokens' log-probs are of (T = 1 for greedy requests); top-k and
//!   top-p are not renormalised, as in our engine's own log-probs.
//!
//! vLLM extensions understood: `stop_token_ids`, `ignore_eos`, `top_k`,
//! `include_stop_str_in_output`, `return_tokens_as_token_ids` (log-prob tokens as
//! `"token_id:N"`) and `return_token_ids` (`token_ids` on each choice). Our own: every
//! non-streamed choice carries `"rollflash": {"output_ids", "versions"}`, and a request may say
//! `rollflash_resumed_len`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rollflash_core::{FinishReason, GenOutput, Generated, SamplingParams};
use rollflash_model::chat::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, Notify};

use super::text::{cut, Cut, Emitter, Piece, Stops};
use super::{reject_unsupported, stop_set, top_k, ApiError, JsonBody, Shared, Watch};
use crate::backend::TokenScore;

/// The prompt of a completion: text or token ids, one or a batch.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenBatch(Vec<Vec<u32>>),
}

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
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
    /// Alternatives listed per token (the sampled token is listed too).
    #[serde(default)]
    logprobs: Option<u32>,
    #[serde(default)]
    echo: bool,
    #[serde(default)]
    stop: Option<StopField>,
    #[serde(default)]
    include_stop_str_in_output: bool,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    ignore_eos: bool,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    return_tokens_as_token_ids: bool,
    #[serde(default)]
    return_token_ids: bool,
    #[serde(default)]
    rollflash_resumed_len: usize,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// The most alternatives per token, as vLLM's default `max_logprobs`.
const MAX_LOGPROBS: u32 = 20;

/// One choice to generate.
struct Job {
    /// Which prompt of the request it belongs to.
    prompt: usize,
    params: SamplingParams,
}

/// How a route presents its choices.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Completions,
    Chat,
}

/// What a request asks about log-probs.
#[derive(Clone, Copy)]
struct LogprobAsk {
    /// Log-probs at all (completions `logprobs` set, chat `logprobs: true`).
    on: bool,
    /// Alternatives per token.
    top: usize,
    /// Log-prob token strings as `token_id:N`.
    as_ids: bool,
}

/// Everything the choices of one request share.
struct Plan {
    route: Route,
    id: String,
    prompts: Vec<Vec<u32>>,
    jobs: Vec<Job>,
    stops: Stops,
    logprobs: LogprobAsk,
    echo: bool,
    return_token_ids: bool,
    resumed_len: usize,
    include_usage: bool,
    /// The LoRA adapter the request's `model` names, if it names one.
    adapter: Option<String>,
}

/// A finished choice.
struct Done {
    out: GenOutput,
    cut: Cut,
    finish: &'static str,
    stop_reason: Value,
    /// Alternatives per output token, when asked.
    scores: Option<Vec<TokenScore>>,
}

pub(crate) async fn completions(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<CompletionBody>,
) -> Result<Response, ApiError> {
    let adapter = check_common(&shared, body.model.as_deref(), &body.extra)?;
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
    if body.logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
        return Err(ApiError::bad_request(format!(
            "logprobs must be between 0 and {MAX_LOGPROBS}"
        )));
    }
    let n = choices_per_prompt(body.n)?;
    let max_tokens = body.max_tokens.unwrap_or(16);
    if max_tokens == 0 && !body.echo {
        return Err(ApiError::bad_request(
            "max_tokens must be positive (0 is allowed with echo)",
        ));
    }
    let base = SamplingParams {
        temperature: body.temperature.unwrap_or(1.0),
        top_p: body.top_p.unwrap_or(1.0),
        top_k: top_k(body.top_k),
        max_new_tokens: max_tokens,
        stop_token_ids: stop_set(
            &shared,
            body.stop_token_ids.unwrap_or_default(),
            body.ignore_eos,
        ),
        seed: body.seed,
    };
    let jobs = jobs(&base, prompts.len(), n);
    let plan = Plan {
        route: Route::Completions,
        id: format!("cmpl-{}", uuid_like()),
        prompts,
        jobs,
        stops: stops(body.stop, body.include_stop_str_in_output)?,
        logprobs: LogprobAsk {
            on: body.logprobs.is_some(),
            top: body.logprobs.unwrap_or(0) as usize,
            as_ids: body.return_tokens_as_token_ids,
        },
        echo: body.echo,
        return_token_ids: body.return_token_ids,
        resumed_len: body.rollflash_resumed_len,
        include_usage: body
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        adapter,
    };
    respond(shared, plan, body.stream).await
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
    /// Alternatives per token (with `logprobs: true`).
    #[serde(default)]
    top_logprobs: Option<u32>,
    #[serde(default)]
    stop: Option<StopField>,
    #[serde(default)]
    include_stop_str_in_output: bool,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    ignore_eos: bool,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
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
) -> Result<Response, ApiError> {
    let adapter = check_common(&shared, body.model.as_deref(), &body.extra)?;
    if body.top_logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
        return Err(ApiError::bad_request(format!(
            "top_logprobs must be between 0 and {MAX_LOGPROBS}"
        )));
    }
    if body.top_logprobs.is_some_and(|k| k > 0) && !body.logprobs {
        return Err(ApiError::bad_request(
            "top_logprobs needs \"logprobs\": true",
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
    let plan = Plan {
        route: Route::Chat,
        id: format!("chatcmpl-{}", uuid_like()),
        jobs: jobs(&base, 1, n),
        prompts: vec![prompt],
        stops: stops(body.stop, body.include_stop_str_in_output)?,
        logprobs: LogprobAsk {
            on: body.logprobs,
            top: body.top_logprobs.unwrap_or(0) as usize,
            as_ids: false,
        },
        echo: false,
        return_token_ids: body.return_token_ids,
        resumed_len: 0,
        include_usage: body
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        adapter,
    };
    respond(shared, plan, body.stream).await
}

/// `n` jobs per prompt, seeds `seed + i`.
fn jobs(base: &SamplingParams, prompts: usize, n: usize) -> Vec<Job> {
    let mut jobs = Vec::with_capacity(prompts * n);
    for prompt in 0..prompts {
        for i in 0..n {
            let mut params = base.clone();
            params.seed = base.seed.map(|s| s.wrapping_add(i as u64));
            jobs.push(Job { prompt, params });
        }
    }
    jobs
}

fn stops(field: Option<StopField>, include: bool) -> Result<Stops, ApiError> {
    let strings = match field {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s],
        Some(StopField::Many(v)) => v,
    };
    if strings.iter().any(String::is_empty) {
        return Err(ApiError::bad_request("stop strings must not be empty"));
    }
    Ok(Stops { strings, include })
}

/// Generates every choice of `plan`, answered as one JSON body or as a stream.
async fn respond(shared: Arc<Shared>, plan: Plan, stream: bool) -> Result<Response, ApiError> {
    let plan = Arc::new(plan);
    if plan.logprobs.top > 0 || (plan.echo && plan.logprobs.on) {
        // Fail before generating when the backend cannot score at all.
        let probe = [plan.prompts[0][0], plan.prompts[0][0]];
        shared
            .backend
            .score(&probe, 1.0, 1)
            .await
            .map_err(|e| ApiError::bad_request(super::error_chain(&e)))?;
    }
    if !stream {
        let outs = futures::future::try_join_all(
            (0..plan.jobs.len()).map(|i| run_choice(&shared, &plan, i, None)),
        )
        .await?;
        return Ok(Json(whole_answer(&shared, &plan, &outs).await?).into_response());
    }
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    let task_shared = Arc::clone(&shared);
    let task_plan = Arc::clone(&plan);
    tokio::spawn(async move {
        let shared = task_shared;
        let plan = task_plan;
        if plan.route == Route::Chat {
            for i in 0..plan.jobs.len() {
                let _ = tx.send(chunk(
                    &shared,
                    &plan,
                    vec![json!({
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": null,
                        "finish_reason": null,
                    })],
                ));
            }
        }
        let outs = futures::future::try_join_all(
            (0..plan.jobs.len()).map(|i| run_choice(&shared, &plan, i, Some(&tx))),
        )
        .await;
        match outs {
            Ok(outs) => {
                if plan.include_usage {
                    let mut c = chunk(&shared, &plan, Vec::new());
                    c["usage"] = usage(&plan, &outs);
                    let _ = tx.send(c);
                }
            }
            Err(e) => {
                let _ = tx.send(Value::Object(e.body()));
            }
        }
        let _ = tx.send(Value::Null);
    });
    let events = futures::stream::unfold(rx, |mut rx| async move {
        let v = rx.recv().await?;
        let event = if v.is_null() {
            Event::default().data("[DONE]")
        } else {
            Event::default().data(v.to_string())
        };
        Some((Ok::<_, Infallible>(event), rx))
    });
    Ok(Sse::new(events).into_response())
}

/// Runs choice `i`: generation (watched when it streams or has stop strings), stop strings,
/// alternatives; sends its chunks to `tx` when streaming.
async fn run_choice(
    shared: &Arc<Shared>,
    plan: &Plan,
    i: usize,
    tx: Option<&mpsc::UnboundedSender<Value>>,
) -> Result<Done, ApiError> {
    let job = &plan.jobs[i];
    let prompt = &plan.prompts[job.prompt];
    let scoring = plan.logprobs.top > 0;
    // Tokens go out as they come only when nothing has to be scored after the generation.
    let live = tx.is_some() && !scoring;
    let mut emitter = Emitter::default();
    let mut text_offset = 0usize;
    if plan.echo {
        if let Some(tx) = tx {
            send_echo(shared, plan, i, tx, &mut text_offset).await?;
        }
    }
    let out = if job.params.max_new_tokens == 0 {
        prompt_only(prompt)
    } else if tx.is_none() && plan.stops.is_empty() {
        shared
            .generate(
                prompt.clone(),
                job.params.clone(),
                None,
                plan.resumed_len,
                plan.adapter.as_deref(),
            )
            .await?
    } else {
        let (tok_tx, mut tok_rx) = mpsc::unbounded_channel::<Generated>();
        let stop = Arc::new(Notify::new());
        let watch = Watch {
            tokens: tok_tx,
            stop: Arc::clone(&stop),
        };
        let generation = shared.generate_watched(
            prompt.clone(),
            job.params.clone(),
            None,
            plan.resumed_len,
            plan.adapter.as_deref(),
            Some(watch),
        );
        let emitter = &mut emitter;
        let text_offset = &mut text_offset;
        let watcher = async {
            let mut so_far = Generated::default();
            while let Some(new) = tok_rx.recv().await {
                so_far.extend(&new);
                let piece = emitter.advance(shared, &so_far.tokens, &plan.stops)?;
                if emitter.hit {
                    stop.notify_one();
                }
                if let (true, Some(piece), Some(tx)) = (live, piece, tx) {
                    let _ = tx.send(piece_chunk(
                        shared,
                        plan,
                        i,
                        &piece,
                        &so_far,
                        None,
                        text_offset,
                        None,
                    ));
                }
            }
            Ok::<(), ApiError>(())
        };
        let (out, watched) = tokio::join!(generation, watcher);
        watched?;
        out?
    };
    let the_cut = cut(shared, &out.output.tokens, &plan.stops)?;
    let mut out = out;
    out.output.tokens.truncate(the_cut.tokens);
    out.output.logprobs.truncate(the_cut.tokens);
    out.output.versions.truncate(the_cut.tokens);
    let (finish, stop_reason) = finish_of(shared, &the_cut, &out);
    let scores = if scoring && !out.output.is_empty() {
        Some(
            output_scores(
                shared,
                prompt,
                &out.output.tokens,
                &job.params,
                plan.logprobs.top,
            )
            .await?,
        )
    } else {
        None
    };
    if let Some(tx) = tx {
        let piece = emitter.finish(&the_cut);
        let _ = tx.send(piece_chunk(
            shared,
            plan,
            i,
            &piece,
            &out.output,
            scores.as_deref(),
            &mut text_offset,
            Some((finish, &stop_reason)),
        ));
    }
    Ok(Done {
        out,
        cut: the_cut,
        finish,
        stop_reason,
        scores,
    })
}

/// The output of `echo` with `max_tokens: 0`: the prompt only, nothing generated.
fn prompt_only(prompt: &[u32]) -> GenOutput {
    GenOutput {
        id: rollflash_core::RequestId(0),
        prompt_len: prompt.len(),
        output: Generated::default(),
        finish_reason: FinishReason::Length,
        start_version: Default::default(),
        served_by: Vec::new(),
    }
}

/// With `echo` on a stream: sends choice `i`'s prompt (and its log-probs, when asked) as
/// the choice's first chunk, advancing `text_offset` past it.
async fn send_echo(
    shared: &Shared,
    plan: &Plan,
    i: usize,
    tx: &mpsc::UnboundedSender<Value>,
    text_offset: &mut usize,
) -> Result<(), ApiError> {
    let job = &plan.jobs[i];
    let prompt = &plan.prompts[job.prompt];
    let prompt_text = shared.decode(prompt)?;
    let lp = if plan.logprobs.on {
        let scores = prompt_scores(shared, prompt, &job.params, plan.logprobs.top).await?;
        Some(completion_logprobs(
            shared,
            prompt,
            &scores
                .iter()
                .map(|s| s.as_ref().map(|s| s.logprob))
                .collect::<Vec<_>>(),
            Some(&scores),
            plan.logprobs,
            text_offset,
        ))
    } else {
        None
    };
    let _ = tx.send(chunk(
        shared,
        plan,
        vec![json!({"index": i, "text": prompt_text, "logprobs": lp,
            "finish_reason": null, "stop_reason": null})],
    ));
    Ok(())
}

/// The `finish_reason` and `stop_reason` of `out`, cut at `the_cut`: a matched stop string,
/// else the stop token (none for an end-of-sequence one), the length limit, or an abort.
fn finish_of(shared: &Shared, the_cut: &Cut, out: &GenOutput) -> (&'static str, Value) {
    match (&the_cut.matched, out.finish_reason) {
        (Some(s), _) => ("stop", json!(s)),
        (None, FinishReason::Stop) => {
            let last = out.output.tokens.last().copied();
            match last {
                Some(t) if !shared.cfg.eos_token_ids.contains(&t) => ("stop", json!(t)),
                _ => ("stop", Value::Null),
            }
        }
        (None, FinishReason::Length) => ("length", Value::Null),
        (None, FinishReason::Aborted) => ("abort", Value::Null),
    }
}

/// The temperature alternatives are scored at: the request's, or 1 for greedy.
fn score_temperature(p: &SamplingParams) -> f64 {
    if p.temperature > 0.0 {
        p.temperature
    } else {
        1.0
    }
}

/// Scores of the output tokens (given the prompt and the output before each).
async fn output_scores(
    shared: &Shared,
    prompt: &[u32],
    output: &[u32],
    p: &SamplingParams,
    top: usize,
) -> Result<Vec<TokenScore>, ApiError> {
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(output);
    let rows = shared
        .backend
        .score(&seq, score_temperature(p), top)
        .await
        .map_err(|e| ApiError::from_backend(&e))?;
    Ok(rows[prompt.len() - 1..].to_vec())
}

/// Scores of the prompt tokens: `None` for the first, which nothing predicts.
async fn prompt_scores(
    shared: &Shared,
    prompt: &[u32],
    p: &SamplingParams,
    top: usize,
) -> Result<Vec<Option<TokenScore>>, ApiError> {
    if prompt.len() < 2 {
        return Ok(vec![None; prompt.len()]);
    }
    let rows = shared
        .backend
        .score(prompt, score_temperature(p), top)
        .await
        .map_err(|e| ApiError::from_backend(&e))?;
    Ok(std::iter::once(None)
        .chain(rows.into_iter().map(Some))
        .collect())
}

/// A log-prob token string: the token's text, or vLLM's `token_id:N`.
fn token_string(shared: &Shared, t: u32, as_ids: bool) -> String {
    if as_ids {
        format!("token_id:{t}")
    } else {
        shared.token_text(t)
    }
}

/// Completions `logprobs` for `ids`: `tokens`, `token_logprobs`, `top_logprobs` (the token
/// itself and its alternatives), `text_offset` continuing from `offset`.
fn completion_logprobs<S: std::borrow::Borrow<TokenScore>>(
    shared: &Shared,
    ids: &[u32],
    lps: &[Option<f32>],
    scores: Option<&[Option<S>]>,
    ask: LogprobAsk,
    offset: &mut usize,
) -> Value {
    let mut tokens = Vec::with_capacity(ids.len());
    let mut tops = Vec::with_capacity(ids.len());
    let mut offsets = Vec::with_capacity(ids.len());
    for (j, (&t, lp)) in ids.iter().zip(lps).enumerate() {
        let s = token_string(shared, t, ask.as_ids);
        offsets.push(*offset);
        *offset += shared.token_text(t).chars().count();
        let top = match lp {
            None => Value::Null,
            Some(lp) => {
                let mut m = Map::new();
                if let Some(Some(sc)) = scores.and_then(|s| s.get(j)) {
                    for &(alt, alp) in &sc.borrow().top {
                        m.insert(token_string(shared, alt, ask.as_ids), json!(alp));
                    }
                }
                m.insert(s.clone(), json!(lp));
                Value::Object(m)
            }
        };
        tokens.push(s);
        tops.push(top);
    }
    json!({
        "tokens": tokens,
        "token_logprobs": lps,
        "top_logprobs": tops,
        "text_offset": offsets,
    })
}

/// Chat `logprobs.content` entries for `ids`.
fn chat_logprobs(
    shared: &Shared,
    ids: &[u32],
    lps: &[f32],
    scores: Option<&[TokenScore]>,
) -> Vec<Value> {
    let entry = |t: u32, lp: f32| {
        let token = shared.token_text(t);
        json!({ "token": token, "logprob": lp, "bytes": token.as_bytes() })
    };
    ids.iter()
        .zip(lps)
        .enumerate()
        .map(|(j, (&t, &lp))| {
            let mut e = entry(t, lp);
            let top: Vec<Value> = scores
                .and_then(|s| s.get(j))
                .map(|s| s.top.iter().map(|&(a, alp)| entry(a, alp)).collect())
                .unwrap_or_default();
            e["top_logprobs"] = json!(top);
            e
        })
        .collect()
}

/// A stream chunk with these choices.
fn chunk(shared: &Shared, plan: &Plan, choices: Vec<Value>) -> Value {
    let object = match plan.route {
        Route::Completions => "text_completion",
        Route::Chat => "chat.completion.chunk",
    };
    json!({
        "id": plan.id,
        "object": object,
        "created": now(),
        "model": shared.cfg.model_name,
        "choices": choices,
    })
}

/// The chunk for one piece of choice `i`'s output (`all` holds the output so far), with the
/// finish reason when it is the last.
#[allow(clippy::too_many_arguments)]
fn piece_chunk(
    shared: &Shared,
    plan: &Plan,
    i: usize,
    piece: &Piece,
    all: &Generated,
    scores: Option<&[TokenScore]>,
    offset: &mut usize,
    finish: Option<(&str, &Value)>,
) -> Value {
    let ids = &all.tokens[piece.start..piece.end];
    let lps = &all.logprobs[piece.start..piece.end];
    let scores = scores.map(|s| &s[piece.start.min(s.len())..piece.end.min(s.len())]);
    let mut c = Map::new();
    c.insert("index".into(), json!(i));
    match plan.route {
        Route::Completions => {
            c.insert("text".into(), json!(piece.text));
            let lp = if plan.logprobs.on {
                let lps: Vec<Option<f32>> = lps.iter().copied().map(Some).collect();
                let scores: Option<Vec<Option<&TokenScore>>> =
                    scores.map(|s| s.iter().map(Some).collect());
                completion_logprobs(shared, ids, &lps, scores.as_deref(), plan.logprobs, offset)
            } else {
                Value::Null
            };
            c.insert("logprobs".into(), lp);
        }
        Route::Chat => {
            let delta = if piece.text.is_empty() {
                json!({})
            } else {
                json!({ "content": piece.text })
            };
            c.insert("delta".into(), delta);
            let lp = if plan.logprobs.on {
                json!({ "content": chat_logprobs(shared, ids, lps, scores) })
            } else {
                Value::Null
            };
            c.insert("logprobs".into(), lp);
        }
    }
    let (f, sr) = finish.map_or((Value::Null, Value::Null), |(f, sr)| (json!(f), sr.clone()));
    c.insert("finish_reason".into(), f);
    c.insert("stop_reason".into(), sr);
    if plan.return_token_ids {
        c.insert("token_ids".into(), json!(ids));
    }
    chunk(shared, plan, vec![Value::Object(c)])
}

/// The non-streamed answer.
async fn whole_answer(shared: &Shared, plan: &Plan, outs: &[Done]) -> Result<Value, ApiError> {
    let mut choices = Vec::with_capacity(outs.len());
    for (index, d) in outs.iter().enumerate() {
        let mut choice = Map::new();
        choice.insert("index".into(), json!(index));
        let out = &d.out.output;
        let scores = d.scores.as_deref();
        match plan.route {
            Route::Completions => {
                let prompt = &plan.prompts[plan.jobs[index].prompt];
                let mut offset = 0usize;
                let mut text = String::new();
                let mut lp = Value::Null;
                if plan.echo {
                    text.push_str(&shared.decode(prompt)?);
                }
                if plan.logprobs.on {
                    let mut ids = Vec::new();
                    let mut lps: Vec<Option<f32>> = Vec::new();
                    let mut all_scores: Vec<Option<TokenScore>> = Vec::new();
                    if plan.echo {
                        let ps = prompt_scores(
                            shared,
                            prompt,
                            &plan.jobs[index].params,
                            plan.logprobs.top,
                        )
                        .await?;
                        ids.extend_from_slice(prompt);
                        lps.extend(ps.iter().map(|s| s.as_ref().map(|s| s.logprob)));
                        all_scores.extend(ps);
                    }
                    ids.extend_from_slice(&out.tokens);
                    lps.extend(out.logprobs.iter().copied().map(Some));
                    match scores {
                        Some(s) => all_scores.extend(s.iter().cloned().map(Some)),
                        None => all_scores.extend(out.tokens.iter().map(|_| None)),
                    }
                    lp = completion_logprobs(
                        shared,
                        &ids,
                        &lps,
                        Some(&all_scores),
                        plan.logprobs,
                        &mut offset,
                    );
                }
                text.push_str(&d.cut.text);
                choice.insert("text".into(), json!(text));
                choice.insert("logprobs".into(), lp);
            }
            Route::Chat => {
                choice.insert(
                    "message".into(),
                    json!({ "role": "assistant", "content": d.cut.text }),
                );
                let lp = if plan.logprobs.on {
                    json!({ "content": chat_logprobs(shared, &out.tokens, &out.logprobs, scores) })
                } else {
                    Value::Null
                };
                choice.insert("logprobs".into(), lp);
            }
        }
        choice.insert("finish_reason".into(), json!(d.finish));
        choice.insert("stop_reason".into(), d.stop_reason.clone());
        extensions(&mut choice, &d.out, plan.return_token_ids);
        choices.push(Value::Object(choice));
    }
    let object = match plan.route {
        Route::Completions => "text_completion",
        Route::Chat => "chat.completion",
    };
    Ok(json!({
        "id": plan.id,
        "object": object,
        "created": now(),
        "model": shared.cfg.model_name,
        "choices": choices,
        "usage": usage(plan, outs),
    }))
}

/// Token counts: each prompt once, every choice's output.
fn usage(plan: &Plan, outs: &[Done]) -> Value {
    let prompt: usize = plan.prompts.iter().map(Vec::len).sum();
    let completion: usize = outs.iter().map(|d| d.out.output.len()).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// `GET /v1/models`: the base model, then each loaded adapter (`parent`: the base), as
/// vLLM lists them.
pub(crate) async fn models(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let mut data = vec![json!({
        "id": shared.cfg.model_name,
        "object": "model",
        "created": shared.created,
        "owned_by": "rollflash",
        "parent": Value::Null,
    })];
    for (name, dir) in shared.adapter_list() {
        data.push(json!({
            "id": name,
            "object": "model",
            "created": shared.created,
            "owned_by": "rollflash",
            "root": dir.to_string_lossy(),
            "parent": shared.cfg.model_name,
        }));
    }
    Json(json!({ "object": "list", "data": data }))
}

/// `POST /v1/load_lora_adapter` body (vLLM's).
#[derive(Debug, Deserialize)]
pub(crate) struct LoadLoraBody {
    lora_name: String,
    lora_path: String,
}

/// `POST /v1/unload_lora_adapter` body (vLLM's; `lora_int_id` is not used here).
#[derive(Debug, Deserialize)]
pub(crate) struct UnloadLoraBody {
    lora_name: String,
}

/// vLLM answers the adapter routes with plain text on success.
pub(crate) async fn load_lora_adapter(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<LoadLoraBody>,
) -> Result<String, ApiError> {
    shared
        .load_adapter(&body.lora_name, &body.lora_path, None)
        .await?;
    Ok(format!(
        "Success: LoRA adapter '{}' added successfully.",
        body.lora_name
    ))
}

pub(crate) async fn unload_lora_adapter(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<UnloadLoraBody>,
) -> Result<String, ApiError> {
    shared.unload_adapter(&body.lora_name)?;
    Ok(format!(
        "Success: LoRA adapter '{}' removed successfully.",
        body.lora_name
    ))
}

/// Checks shared by both routes: the model name, no unsupported sampling.
fn check_common(
    shared: &Shared,
    model: Option<&str>,
    extra: &Map<String, Value>,
) -> Result<Option<String>, ApiError> {
    let mut adapter = None;
    if let Some(m) = model {
        if shared.has_adapter(m) {
            // vLLM's way: a loaded adapter is requested by its name as the model.
            adapter = Some(m.to_string());
        } else if m != shared.cfg.model_name {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "The model `{m}` does not exist: this server serves `{}`",
                    shared.cfg.model_name
                ),
            ));
        }
    }
    // `n` is handled by the routes; the list's entry for it is for SGLang's sampling_params.
    let mut extra = extra.clone();
    extra.remove("n");
    reject_unsupported(&extra, "")?;
    Ok(adapter)
}

/// `n` within a sane bound: each choice is a full generation.
fn choices_per_prompt(n: Option<usize>) -> Result<usize, ApiError> {
    match n.unwrap_or(1) {
        0 => Err(ApiError::bad_request("n must be at least 1")),
        n if n > 128 => Err(ApiError::bad_request("n must be at most 128")),
        n => Ok(n),
    }
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

/// A response id unique enough for logs: the time in nanoseconds and a random tag.
fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}{:08x}", rand::random::<u32>())
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
