//! Timing the real engine: every step of a continuous-batching engine driven through chains
//! of requests (one per sample for single-turn tasks; an episode's turns, each submitted
//! when the one before it finished, for multi-turn ones), recorded as the cost model sees
//! a step.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use rollflash_core::{PolicyVersion, RequestId, SamplingParams};
use rollflash_model::engine::{Engine, EngineConfig, EngineRequest};
use rollflash_model::model::Transformer;

use super::fit::StepSample;
use super::CalibrateError;

/// One request of a chain.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
}

/// Per chain, per turn: the tokens the engine generated.
pub type ChainOutputs = Vec<Vec<Vec<u32>>>;

/// An engine with the run's admission limit and threads.
pub fn engine(
    model: &Arc<Transformer>,
    threads: usize,
    max_running: usize,
) -> Result<Engine, CalibrateError> {
    Ok(Engine::new(
        Arc::clone(model),
        PolicyVersion(0),
        EngineConfig {
            max_running_requests: max_running,
            threads,
            ..Default::default()
        },
    )?)
}

/// Per live request: its chain, its turn, its prompt length and tokens generated so far.
struct Live {
    chain: usize,
    turn: usize,
    prompt: usize,
    generated: usize,
}

/// Adds one step's tokens to the live requests and returns the step as the cost model sees
/// it (`None` when nothing was generated).
fn record(
    out: &rollflash_model::engine::StepOutput,
    live: &mut HashMap<u64, Live>,
    secs: f64,
    mut on_token: impl FnMut(&Live, u32),
) -> Option<StepSample> {
    let (mut context, mut decoding) = (0usize, 0usize);
    for (id, tok) in &out.new_tokens {
        if let Some(l) = live.get_mut(&id.0) {
            context += l.prompt + l.generated;
            if l.generated > 0 {
                decoding += 1;
            }
            l.generated += 1;
            on_token(l, *tok);
        }
    }
    if out.new_tokens.is_empty() {
        return None;
    }
    Some(StepSample {
        batch: out.new_tokens.len() as f64,
        context: context as f64,
        prefill: out.forward_tokens.saturating_sub(decoding) as f64,
        secs,
    })
}

/// Runs `chains` through a real engine until all are done, timing every step: the first
/// request of every chain is submitted at once, in order, and each later one when the one
/// before it in its chain finished (what an episode's turns do, without environment
/// waits). Returns the steps and, per chain and turn, the generated tokens.
pub fn time_chains(
    model: &Arc<Transformer>,
    threads: usize,
    max_running: usize,
    chains: &[Vec<TurnRequest>],
) -> Result<(Vec<StepSample>, ChainOutputs), CalibrateError> {
    let mut e = engine(model, threads, max_running)?;
    let mut outputs: Vec<Vec<Vec<u32>>> =
        chains.iter().map(|c| vec![Vec::new(); c.len()]).collect();
    let mut live: HashMap<u64, Live> = HashMap::new();
    let mut next_id = 0u64;
    let mut submit = |e: &mut Engine,
                      live: &mut HashMap<u64, Live>,
                      chain: usize,
                      turn: usize|
     -> Result<(), CalibrateError> {
        let Some(req) = chains.get(chain).and_then(|c| c.get(turn)) else {
            return Ok(());
        };
        let id = next_id;
        next_id += 1;
        live.insert(
            id,
            Live {
                chain,
                turn,
                prompt: req.prompt.len(),
                generated: 0,
            },
        );
        e.submit(EngineRequest {
            id: RequestId(id),
            prompt: req.prompt.clone(),
            params: req.params.clone(),
            resume: None,
        })?;
        Ok(())
    };
    for chain in 0..chains.len() {
        submit(&mut e, &mut live, chain, 0)?;
    }
    let mut steps = Vec::new();
    while !e.is_idle() {
        let t0 = Instant::now();
        let out = e.step()?;
        let secs = t0.elapsed().as_secs_f64();
        if let Some(s) = record(&out, &mut live, secs, |l, tok| {
            if let Some(o) = outputs.get_mut(l.chain).and_then(|c| c.get_mut(l.turn)) {
                o.push(tok);
            }
        }) {
            steps.push(s);
        }
        for c in &out.finished {
            if let Some(l) = live.remove(&c.id.0) {
                submit(&mut e, &mut live, l.chain, l.turn + 1)?;
            }
        }
    }
    Ok((steps, outputs))
}

/// Keeps a real engine full with `requests` (cycled, each with its own seed) until `stop`
/// is set, timing every step; `started` is set after the first step.
pub fn generate_until(
    model: &Arc<Transformer>,
    threads: usize,
    max_running: usize,
    requests: &[TurnRequest],
    stop: &std::sync::atomic::AtomicBool,
    started: &std::sync::atomic::AtomicBool,
) -> Result<Vec<StepSample>, CalibrateError> {
    use std::sync::atomic::Ordering;
    let mut e = engine(model, threads, max_running)?;
    let mut next = 0usize;
    let mut live: HashMap<u64, Live> = HashMap::new();
    let mut steps = Vec::new();
    if requests.is_empty() {
        started.store(true, Ordering::Relaxed);
        return Ok(steps);
    }
    while !stop.load(Ordering::Relaxed) {
        while e.num_running() + e.num_waiting() < max_running {
            let r = &requests[next % requests.len()];
            live.insert(
                next as u64,
                Live {
                    chain: 0,
                    turn: 0,
                    prompt: r.prompt.len(),
                    generated: 0,
                },
            );
            e.submit(EngineRequest {
                id: RequestId(next as u64),
                prompt: r.prompt.clone(),
                params: SamplingParams {
                    seed: Some(next as u64),
                    ..r.params.clone()
                },
                resume: None,
            })?;
            next += 1;
        }
        let t0 = Instant::now();
        let out = e.step()?;
        let secs = t0.elapsed().as_secs_f64();
        let step = record(&out, &mut live, secs, |_, _| {});
        for c in &out.finished {
            live.remove(&c.id.0);
        }
        started.store(true, Ordering::Relaxed);
        if let Some(s) = step {
            steps.push(s);
        }
    }
    Ok(steps)
}
