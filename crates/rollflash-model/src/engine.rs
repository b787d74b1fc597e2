//! The generation engine: continuous batching over one [`Transformer`] with per-sequence KV
//! caches, on its own thread pool.
//!
//! The engine is synchronous and single-owner: a caller (the rollout plane's engine worker)
//! submits requests, calls [`Engine::step`] in a loop, and reads finished completions. Each
//! step admits waiting requests up to `max_running_requests`, runs one packed forward in which
//! new sequences prefill while running ones decode one token, and samples. Sequences join and
//! leave between steps; an aborted sequence returns its partial output, which can be resumed
//! later (under newer weights) from exactly those tokens.

use std::collections::VecDeque;
use std::sync::Arc;

use rollflash_core::{FinishReason, PolicyVersion, RequestId};

use crate::model::{Chunk, KvCache, Logits, Transformer};
use crate::sampling::{sample, SamplingParams};
use crate::{ModelError, Result};

/// Sizing of one engine instance.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Sequences decoded together; the rest wait in FIFO order.
    pub max_running_requests: usize,
    /// Prompt tokens prefilled per step across new sequences (at least one sequence is always
    /// admitted), so a burst of long prompts does not stall running decodes for long.
    pub max_prefill_tokens: usize,
    /// CPU threads of this engine's own pool.
    pub threads: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_running_requests: 64,
            max_prefill_tokens: 4096,
            threads: 1,
        }
    }
}

pub use rollflash_core::Generated;

/// One generation request.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Output of an earlier, aborted attempt: it is prefilled after the prompt and kept at the
    /// start of the output (with its original log-probs and versions); it counts against
    /// `max_new_tokens`.
    pub resume: Option<Generated>,
}

/// A finished (or aborted) request.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub id: RequestId,
    pub prompt_len: usize,
    pub output: Generated,
    pub finish_reason: FinishReason,
}

/// What one [`Engine::step`] did.
#[derive(Debug, Default)]
pub struct StepOutput {
    /// `(request, token)` for every token sampled in this step, in batch order.
    pub new_tokens: Vec<(RequestId, u32)>,
    /// Requests that finished in this step.
    pub finished: Vec<Completion>,
    /// Tokens run through the model (prefill + decode).
    pub forward_tokens: usize,
}

struct Running {
    req: EngineRequest,
    out: Generated,
    cache: KvCache,
    /// Tokens not yet in the cache: the whole prompt (+ resume) at first, then the last token.
    pending: Vec<u32>,
    seed: u64,
}

/// Continuous-batching generation over one model.
pub struct Engine {
    model: Arc<Transformer>,
    version: PolicyVersion,
    cfg: EngineConfig,
    waiting: VecDeque<EngineRequest>,
    running: Vec<Running>,
    pool: Arc<rayon::ThreadPool>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("version", &self.version)
            .field("cfg", &self.cfg)
            .field("waiting", &self.waiting.len())
            .field("running", &self.running.len())
            .finish()
    }
}

impl Engine {
    /// An engine serving `model` as policy `version`.
    pub fn new(model: Arc<Transformer>, version: PolicyVersion, cfg: EngineConfig) -> Result<Self> {
        if cfg.max_running_requests == 0 {
            return Err(ModelError::InvalidRequest(
                "engine.max_running_requests must be positive".into(),
            ));
        }
        let threads = cfg.threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("rollflash-engine-{i}"))
            .build()
            .map_err(|source| ModelError::ThreadPool { threads, source })?;
        Ok(Engine {
            model,
            version,
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            pool: Arc::new(pool),
        })
    }

    /// The policy version new tokens are attributed to.
    pub fn version(&self) -> PolicyVersion {
        self.version
    }

    /// The model being served.
    pub fn model(&self) -> &Arc<Transformer> {
        &self.model
    }

    /// Publishes new weights in process (no disk round trip). Running sequences keep their
    /// KV caches and continue ("keep" mode): their next tokens carry the new version. A caller
    /// wanting "abort" mode aborts them first.
    pub fn set_weights(&mut self, model: Arc<Transformer>, version: PolicyVersion) {
        self.model = model;
        self.version = version;
    }

    /// Queues a request. Errors on an empty prompt, bad params or a prompt past the context.
    pub fn submit(&mut self, req: EngineRequest) -> Result<()> {
        req.params.validate()?;
        if req.prompt.is_empty() {
            return Err(ModelError::InvalidRequest(format!(
                "{}: empty prompt",
                req.id
            )));
        }
        let ctx = self.model.config().max_position_embeddings;
        let resumed = req.resume.as_ref().map_or(0, Generated::len);
        if req.prompt.len() + resumed >= ctx {
            return Err(ModelError::InvalidRequest(format!(
                "{}: prompt of {} tokens leaves no room in a context of {ctx}",
                req.id,
                req.prompt.len() + resumed
            )));
        }
        let vocab = self.model.config().vocab_size;
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::InvalidRequest(format!(
                "{}: token id {bad} is outside the vocabulary of {vocab}",
                req.id
            )));
        }
        self.waiting.push_back(req);
        Ok(())
    }

    /// Aborts a waiting or running request, returning what it had generated.
    pub fn abort(&mut self, id: RequestId) -> Option<Completion> {
        if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            let req = self.waiting.remove(i)?;
            return Some(Completion {
                id,
                prompt_len: req.prompt.len(),
                output: req.resume.unwrap_or_default(),
                finish_reason: FinishReason::Aborted,
            });
        }
        let i = self.running.iter().position(|r| r.req.id == id)?;
        let r = self.running.swap_remove(i);
        Some(Completion {
            id,
            prompt_len: r.req.prompt.len(),
            output: r.out,
            finish_reason: FinishReason::Aborted,
        })
    }

    /// The output so far of a running request (resumed tokens first); `None` while it waits
    /// or when it is unknown. For streaming the tokens of a step as they are sampled.
    pub fn partial_output(&self, id: RequestId) -> Option<&Generated> {
        self.running.iter().find(|r| r.req.id == id).map(|r| &r.out)
    }

    /// Aborts everything, waiting and running, returning the partial outputs.
    pub fn abort_all(&mut self) -> Vec<Completion> {
        let ids: Vec<RequestId> = self
            .running
            .iter()
            .map(|r| r.req.id)
            .chain(self.waiting.iter().map(|r| r.id))
            .collect();
        ids.into_iter().filter_map(|id| self.abort(id)).collect()
    }

    /// Sequences in the running batch.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting for a slot.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether there is nothing to do.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// One scheduling step: admit, forward, sample, retire.
    pub fn step(&mut self) -> Result<StepOutput> {
        self.admit();
        if self.running.is_empty() {
            return Ok(StepOutput::default());
        }
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.step_inner())
    }

    /// Runs `step` until every submitted request has finished; returns completions in
    /// finishing order.
    pub fn run_to_completion(&mut self) -> Result<Vec<Completion>> {
        let mut done = Vec::new();
        while !self.is_idle() {
            done.extend(self.step()?.finished);
        }
        Ok(done)
    }

    fn admit(&mut self) {
        let mut budget = self.cfg.max_prefill_tokens;
        let mut admitted_any = false;
        while self.running.len() < self.cfg.max_running_requests {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let cost = front.prompt.len() + front.resume.as_ref().map_or(0, Generated::len);
            if admitted_any && cost > budget {
                break;
            }
            let Some(req) = self.waiting.pop_front() else {
                break;
            };
            budget = budget.saturating_sub(cost);
            admitted_any = true;
            let out = req.resume.clone().unwrap_or_default();
            let mut pending = req.prompt.clone();
            pending.extend_from_slice(&out.tokens);
            let seed = req.params.seed_for(req.id);
            self.running.push(Running {
                cache: KvCache::new(self.model.config().num_hidden_layers),
                req,
                out,
                pending,
                seed,
            });
        }
    }

    fn step_inner(&mut self) -> Result<StepOutput> {
        let model = Arc::clone(&self.model);
        let (chunks, mut caches): (Vec<Chunk<'_>>, Vec<&mut KvCache>) = self
            .running
            .iter_mut()
            .map(|r| {
                let Running { pending, cache, .. } = r;
                let chunk = Chunk {
                    tokens: pending.as_slice(),
                    start_pos: cache.len(),
                };
                (chunk, cache)
            })
            .unzip();
        let forward_tokens = chunks.iter().map(|c| c.tokens.len()).sum();
        let logits = model.forward(&chunks, Some(&mut caches), Logits::LastOfEachChunk, true)?;
        drop(chunks);
        let logits = logits.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?;

        let ctx = model.config().max_position_embeddings;
        let mut out = StepOutput {
            forward_tokens,
            ..Default::default()
        };
        let mut finished_idx = Vec::new();
        for (i, (r, row)) in self.running.iter_mut().zip(&logits).enumerate() {
            let index = r.out.len() as u64;
            let s = sample(row, &r.req.params, r.seed, index)?;
            r.out.tokens.push(s.token);
            r.out.logprobs.push(s.logprob);
            r.out.versions.push(self.version);
            out.new_tokens.push((r.req.id, s.token));
            r.pending.clear();
            r.pending.push(s.token);
            let reason = if r.req.params.stop_token_ids.contains(&s.token) {
                Some(FinishReason::Stop)
            } else if r.out.len() >= r.req.params.max_new_tokens || r.cache.len() + 1 >= ctx {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                finished_idx.push((i, reason));
            }
        }
        for &(i, reason) in finished_idx.iter().rev() {
            let r = self.running.swap_remove(i);
            out.finished.push(Completion {
                id: r.req.id,
                prompt_len: r.req.prompt.len(),
                output: r.out,
                finish_reason: reason,
            });
        }
        out.finished.reverse();
        Ok(out)
    }
}
