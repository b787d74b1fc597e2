//! `rollflash sim`: the discrete-event simulator's scenarios as tables (Markdown + CSV) and
//! PNG charts, and `rollflash sim validate`, which calibrates the simulator's cost model on
//! this machine and compares a simulated run with a measured `rollflash train` run.
//!
//! Validation, step by step (see `BENCHMARKS.md`):
//! 1. `rollflash train --set output_dir=D …` writes `D/metrics.jsonl`.
//! 2. `rollflash sim validate --metrics D/metrics.jsonl --set output_dir=D …` with the same
//!    `--set`s: builds the run's initial policy (or its cached warm-up), draws the run's
//!    own first prompts, and times the real engine on them (continuous batching, the run's
//!    sampling) and the real learner on batches of the responses. A least-squares fit of
//!    every engine step gives the decode/prefill cost; two batch sizes give the training
//!    cost; the generated lengths are the workload. Nothing is taken from the metrics but
//!    the number of steps.
//! 3. The simulator runs the run's config with those costs; samples/s are compared.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use clap::{Args, Subcommand};
use rollflash_core::buffer::{Batch, BatchGroup, GroupKey};
use rollflash_core::{PolicyVersion, RequestId, SamplingParams, Trajectory};
use rollflash_env::envs::make_env;
use rollflash_model::config::ModelConfig;
use rollflash_model::engine::{Engine, EngineConfig, EngineRequest};
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::train::TrainableModel;
use rollflash_model::weights::Weights;
use rollflash_plot::{line_chart, Chart, Series};
use rollflash_run::config::TrainConfig;
use rollflash_sim::scenario::{self, Scale};
use rollflash_sim::{
    simulate, Cell, InferenceCost, LatencyDist, LengthDist, SimConfig, Table, TrainCost,
};
use rollflash_trainer::learner::PolicyLearner;
use rollflash_trainer::Learner;

#[derive(Debug, Args)]
pub struct SimArgs {
    #[command(subcommand)]
    command: Option<SimCommand>,
    /// Where tables (`.md`, `.csv`) and charts (`.png`) go.
    #[arg(long, default_value = "runs/sim", global = true)]
    out: PathBuf,
    /// Fewer steps and points (a smoke run, seconds instead of minutes).
    #[arg(long)]
    quick: bool,
}

#[derive(Debug, Subcommand)]
enum SimCommand {
    /// Calibrate on this machine and compare a simulated run with a measured one.
    Validate(ValidateArgs),
}

#[derive(Debug, Args)]
struct ValidateArgs {
    /// `metrics.jsonl` of the `rollflash train` run (one or more, same config apart from
    /// the listed `--set`s is not supported: pass one run per invocation).
    #[arg(long)]
    metrics: PathBuf,
    /// The run's config file, if it had one.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The run's `--set` overrides (same syntax as `rollflash train`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Prompts drawn for calibration (the run's first tasks).
    #[arg(long, default_value_t = 256)]
    prompts: usize,
}

pub fn run(a: SimArgs) -> Result<()> {
    match a.command {
        Some(SimCommand::Validate(v)) => validate(v, &a.out),
        None => scenarios(&a.out, a.quick),
    }
}

fn scenarios(out: &Path, quick: bool) -> Result<()> {
    let scale = if quick { Scale::Quick } else { Scale::Full };
    let t0 = Instant::now();
    let tables = scenario::all(scale)?;
    write_tables(out, &tables)?;
    println!(
        "simulated in {:.1} s; tables and charts in {}",
        t0.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

/// Prints every table and writes `NAME.md`, `NAME.csv` and its charts (`PLOT.png`).
fn write_tables(out: &Path, tables: &[Table]) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut all_md = String::new();
    for t in tables {
        let md = t.to_markdown();
        println!("{md}");
        all_md.push_str(&md);
        all_md.push('\n');
        write(&out.join(format!("{}.md", t.name)), &md)?;
        write(&out.join(format!("{}.csv", t.name)), &t.to_csv())?;
        for p in &t.plots {
            let mut chart = Chart::new(&p.title, &p.x_label, &p.y_label);
            chart.log_x = p.log_x;
            for (name, pts) in &p.series {
                chart = chart.with(Series::new(name.clone(), pts.clone()));
            }
            let path = out.join(format!("{}.png", p.name));
            line_chart(&path, &chart).with_context(|| format!("drawing {}", path.display()))?;
        }
    }
    write(&out.join("tables.md"), &all_md)
}

fn write(path: &Path, text: &str) -> Result<()> {
    let mut f =
        std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// What the measured run reported, summed over its steps.
#[derive(Debug, Default)]
struct Measured {
    steps: usize,
    samples: f64,
    tokens: f64,
    wall: f64,
    train: f64,
    sync: f64,
}

fn read_metrics(path: &Path) -> Result<Measured> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut m = Measured::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
        let f = |k: &str| -> Result<f64> {
            v[k].as_f64()
                .with_context(|| format!("{} line {}: no number `{k}`", path.display(), i + 1))
        };
        m.steps += 1;
        m.samples += f("samples")?;
        m.tokens += f("tokens")?;
        m.wall += f("wall_s")?;
        m.train += f("train_s")?;
        // Older runs wrote `sync_s`, newer ones `weight_sync_ms`.
        m.sync += f("sync_s").or_else(|_| f("weight_sync_ms").map(|ms| ms / 1e3))?;
    }
    if m.steps == 0 {
        bail!("{}: no steps", path.display());
    }
    Ok(m)
}

/// One generated sample: the index of its prompt and its tokens.
type Generation = (usize, Vec<u32>);

/// One engine step as the cost model sees it.
struct StepSample {
    batch: f64,
    context: f64,
    prefill: f64,
    secs: f64,
}

fn validate(a: ValidateArgs, out: &Path) -> Result<()> {
    let cfg = TrainConfig::load(a.config.as_deref(), &a.sets)?;
    let measured = read_metrics(&a.metrics)?;
    if cfg.model.path.is_some() {
        bail!("sim validate supports the built-in model only (model.path is set)");
    }
    let device = Device::Cpu;
    let tokenizer = Tokenizer::builtin();
    let eos = tokenizer
        .eos_token_id()
        .context("built-in tokenizer has no eos")?;
    let model_cfg = ModelConfig::builtin_default(tokenizer.vocab_size(), eos);
    // The run's starting policy: its cached warm-up, or the seeded random init.
    let weights = if cfg.warmup.steps > 0 {
        let dir = cfg.output_dir.join(format!(
            "warmup-{:016x}",
            rollflash_run::warmup::cache_key(&cfg)
        ));
        if !dir.join("model.safetensors").exists() {
            bail!(
                "no cached warm-up in {} — run `rollflash train` with the same settings first",
                dir.display()
            );
        }
        rollflash_model::hf::load_weights(&dir, &device)?
    } else {
        Weights::random(&model_cfg, cfg.seed, DType::F32, &device)?
    };

    // The run's first prompts: the controller gives group k the seed `seed·1000003 + k`.
    let group = cfg.buffer.group_size;
    let n_groups = a.prompts.div_ceil(group).max(2);
    let base_seed = cfg.seed.wrapping_mul(1_000_003);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .context("cannot start a runtime for environment resets")?;
    let mut prompts = Vec::new();
    for k in 0..n_groups as u64 {
        let mut env = make_env(&cfg.env)?;
        let obs = rt.block_on(env.reset(base_seed + k))?.observation;
        let mut ids: Vec<u32> = tokenizer.bos_token_id().into_iter().collect();
        ids.extend(tokenizer.encode(&obs, false)?);
        prompts.push(ids);
    }

    println!(
        "calibrating on this machine: engine ({} thread(s)) on {} prompts × {group}, then the learner ({} thread(s))",
        cfg.rollout.engine_threads,
        n_groups,
        cfg.train.threads
    );
    let model = Arc::new(rollflash_model::model::Transformer::from_weights(
        &model_cfg,
        &weights,
        DType::F32,
        &device,
    )?);
    let sampling = SamplingParams {
        temperature: cfg.rollout.temperature,
        top_p: cfg.rollout.top_p,
        max_new_tokens: cfg.rollout.max_new_tokens,
        stop_token_ids: vec![eos],
        ..Default::default()
    };
    let mut steps = Vec::new();
    let mut responses: Vec<(usize, Vec<u32>)> = Vec::new();
    // Two passes: the run's admission limit, and a small one for low-batch points.
    for (pass, max_running) in [cfg.rollout.max_running_requests, 4]
        .into_iter()
        .enumerate()
    {
        let groups = if pass == 0 { n_groups } else { 2 };
        let (s, r) = time_engine(
            &model,
            cfg.rollout.engine_threads,
            max_running,
            &prompts[..groups],
            group,
            &sampling,
        )?;
        steps.extend(s);
        if pass == 0 {
            responses = r;
        }
    }
    let inference = fit_inference(&steps);
    println!(
        "engine: {} steps fitted: step {:.3} ms + {:.1} µs/sequence + {:.3} µs/context token, prefill {:.1} µs/token",
        steps.len(),
        inference.step_s * 1e3,
        inference.seq_s * 1e6,
        inference.context_token_s * 1e6,
        inference.prefill_token_s * 1e6
    );

    // The learner on batches of those very trajectories.
    let trajs: Vec<Trajectory> = responses
        .iter()
        .map(|(p, toks)| {
            let prompt = &prompts[*p];
            let mut t = Trajectory::default();
            for &tok in prompt {
                t.push(tok, 0, 0.0, PolicyVersion(0));
            }
            t.prompt_len = prompt.len();
            for &tok in toks {
                t.push(tok, 1, -1.0, PolicyVersion(0));
            }
            t
        })
        .collect();
    let (training, mut learner, batch, batch_tokens) =
        time_learner(&cfg, &model_cfg, &weights, &trajs)?;
    println!(
        "learner: {:.1} ms/step + {:.1} µs/token",
        training.step_s * 1e3,
        training.token_s * 1e6
    );
    // Engines and trainer share this machine's cores: measure how much they slow each
    // other when they run together (the asynchronous run overlaps them; sync never does).
    let (gen_slow, train_slow) = time_contention(
        &model,
        cfg.rollout.engine_threads,
        cfg.rollout.max_running_requests,
        &prompts,
        &sampling,
        &inference,
        &training,
        &mut learner,
        &batch,
        batch_tokens,
    )?;
    println!(
        "together: engine steps {gen_slow:.2}× and training {train_slow:.2}× as long as alone"
    );

    let prompt_lens: Vec<u64> = responses
        .iter()
        .map(|(p, _)| prompts[*p].len() as u64)
        .collect();
    let response_lens: Vec<u64> = responses.iter().map(|(_, r)| r.len() as u64).collect();
    let mut sim = SimConfig {
        seed: cfg.seed,
        steps: measured.steps,
        ..Default::default()
    };
    sim.cluster.inference_workers = cfg.rollout.engines;
    sim.cluster.max_running = cfg.rollout.max_running_requests;
    sim.cluster.routing = cfg.rollout.routing;
    sim.cluster.train_workers = 1;
    sim.cluster.contention = rollflash_sim::Contention {
        gen: gen_slow,
        train: train_slow,
    };
    sim.inference = inference;
    sim.training = training;
    sim.workload.prompt_tokens = LengthDist::Empirical {
        tokens: prompt_lens,
    };
    sim.workload.response_tokens = LengthDist::Empirical {
        tokens: response_lens.clone(),
    };
    sim.workload.max_new_tokens = cfg.rollout.max_new_tokens as u64;
    sim.workload.max_total_tokens = cfg.rollout.max_total_tokens as u64;
    sim.workload.max_turns = cfg.rollout.max_turns.max(1) as u32;
    sim.workload.step_latency = LatencyDist::Fixed { secs: 0.0 };
    sim.sched.buffer = cfg.buffer.clone();
    sim.sched.sync = cfg.controller.sync;
    sim.sched.redundancy = cfg.rollout.group_size_redundancy;
    sim.sched.pause_mode = cfg.controller.pause_mode;
    let r = simulate(&sim)?;

    let real_sps = measured.samples / measured.wall;
    let sim_sps = r.samples_per_s();
    let err = (sim_sps - real_sps) / real_sps;
    let mode = if cfg.controller.sync {
        "sync (α=0, barrier)".to_string()
    } else {
        format!("async α={}", cfg.buffer.alpha)
    };
    let mut t = Table::new(
        "validate",
        &format!(
            "Simulated vs measured: {mode}, {} steps of {}×{}",
            measured.steps, cfg.buffer.groups_per_batch, group
        ),
        &["quantity", "measured", "simulated", "sim / measured"],
    );
    let n = measured.steps as f64;
    let sim_steps = r.steps.len().max(1) as f64;
    let row = |name: &str, m: f64, s: f64, digits: usize| {
        vec![
            Cell::text(name),
            Cell::num(m, digits),
            Cell::num(s, digits),
            Cell::num(s / m, 2),
        ]
    };
    t.rows.push(row("samples/s", real_sps, sim_sps, 2));
    t.rows.push(row(
        "wall s/step",
        measured.wall / n,
        r.steps.iter().map(|s| s.wall_s).sum::<f64>() / sim_steps,
        3,
    ));
    t.rows.push(row(
        "train s/step",
        measured.train / n,
        r.steps.iter().map(|s| s.train_s).sum::<f64>() / sim_steps,
        3,
    ));
    t.rows.push(row(
        "response tokens/sample",
        measured.tokens / measured.samples,
        r.trained_response_tokens as f64 / r.trained_samples.max(1) as f64,
        2,
    ));
    t.rows.push(row(
        "sync s/step",
        measured.sync / n,
        r.steps.iter().map(|s| s.sync_s).sum::<f64>() / sim_steps,
        4,
    ));
    t.note = format!(
        "Throughput error {:+.1}% (aim: within 15%). Costs calibrated on this machine just \
         now; the workload is the run's own first {} prompts with responses generated by its \
         starting policy; only the step count comes from {}.",
        err * 100.0,
        responses.len(),
        a.metrics.display()
    );
    write_tables(out, &[t])?;
    Ok(())
}

/// Runs `groups` prompts × `group` samples through a real engine, timing every step.
/// Returns the steps and, per sample, (prompt index, generated tokens).
fn time_engine(
    model: &Arc<rollflash_model::model::Transformer>,
    threads: usize,
    max_running: usize,
    prompts: &[Vec<u32>],
    group: usize,
    sampling: &SamplingParams,
) -> Result<(Vec<StepSample>, Vec<Generation>)> {
    let mut e = Engine::new(
        Arc::clone(model),
        PolicyVersion(0),
        EngineConfig {
            max_running_requests: max_running,
            threads,
            ..Default::default()
        },
    )?;
    let mut prompt_of = Vec::new();
    let mut generated = Vec::new();
    let mut outputs = Vec::new();
    for (p, prompt) in prompts.iter().enumerate() {
        for i in 0..group {
            let id = prompt_of.len();
            prompt_of.push(p);
            generated.push(0usize);
            outputs.push(Vec::new());
            e.submit(EngineRequest {
                id: RequestId(id as u64),
                prompt: prompt.clone(),
                params: SamplingParams {
                    seed: Some((p * 1000 + i) as u64),
                    ..sampling.clone()
                },
                resume: None,
            })?;
        }
    }
    let mut steps = Vec::new();
    while !e.is_idle() {
        let t0 = Instant::now();
        let out = e.step()?;
        let secs = t0.elapsed().as_secs_f64();
        let mut context = 0usize;
        let mut decoding = 0usize;
        for (id, tok) in &out.new_tokens {
            let i = id.0 as usize;
            context += prompts[prompt_of[i]].len() + generated[i];
            if generated[i] > 0 {
                decoding += 1;
            }
            generated[i] += 1;
            outputs[i].push(*tok);
        }
        if out.new_tokens.is_empty() {
            continue;
        }
        steps.push(StepSample {
            batch: out.new_tokens.len() as f64,
            context: context as f64,
            prefill: out.forward_tokens.saturating_sub(decoding) as f64,
            secs,
        });
    }
    let samples = outputs
        .into_iter()
        .enumerate()
        .map(|(i, o)| (prompt_of[i], o))
        .collect();
    Ok((steps, samples))
}

/// Least squares of `secs ≈ a + b·batch + c·context + p·prefill`, negatives clamped to 0
/// (a coefficient the data cannot see is dropped and the rest refitted).
fn fit_inference(steps: &[StepSample]) -> InferenceCost {
    let rows: Vec<([f64; 4], f64)> = steps
        .iter()
        .map(|s| ([1.0, s.batch, s.context, s.prefill], s.secs))
        .collect();
    let mut active = [true; 4];
    let mut coef = [0.0; 4];
    for _ in 0..4 {
        coef = least_squares(&rows, &active);
        let mut changed = false;
        for k in 0..4 {
            if active[k] && coef[k] < 0.0 {
                active[k] = false;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    InferenceCost {
        step_s: coef[0].max(0.0),
        seq_s: coef[1].max(0.0),
        context_token_s: coef[2].max(0.0),
        prefill_token_s: coef[3].max(0.0),
    }
}

/// Ordinary least squares over the active columns (normal equations, Gaussian
/// elimination with partial pivoting; 4 unknowns at most).
fn least_squares(rows: &[([f64; 4], f64)], active: &[bool; 4]) -> [f64; 4] {
    let idx: Vec<usize> = (0..4).filter(|&k| active[k]).collect();
    let n = idx.len();
    let mut m = vec![vec![0.0; n + 1]; n];
    for (x, y) in rows {
        for (i, &a) in idx.iter().enumerate() {
            for (j, &b) in idx.iter().enumerate() {
                m[i][j] += x[a] * x[b];
            }
            m[i][n] += x[a] * y;
        }
    }
    for col in 0..n {
        let Some(piv) = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))
        else {
            continue;
        };
        m.swap(col, piv);
        let d = m[col][col];
        if d.abs() < 1e-300 {
            continue;
        }
        let pivot = m[col].clone();
        for (r, row) in m.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / d;
                for (x, p) in row.iter_mut().zip(&pivot).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    let mut out = [0.0; 4];
    for (i, &k) in idx.iter().enumerate() {
        if m[i][i].abs() > 1e-300 {
            out[k] = m[i][n] / m[i][i];
        }
    }
    out
}

/// Times the run's learner on batches of `trajs` of two sizes; fits `a + b·tokens`.
fn time_learner(
    cfg: &TrainConfig,
    model_cfg: &ModelConfig,
    weights: &Weights,
    trajs: &[Trajectory],
) -> Result<(TrainCost, PolicyLearner, Batch<Trajectory>, usize)> {
    let model = TrainableModel::new(model_cfg, weights, DType::F32, &Device::Cpu)?;
    let mut learner = PolicyLearner::new(model, cfg.learner_config(&Device::Cpu))?;
    let group = cfg.buffer.group_size.max(1);
    let full = cfg.buffer.groups_per_batch.max(2);
    let mut points = Vec::new();
    let mut last = None;
    for (rep, groups) in [full, full / 2, full, full / 2, full]
        .into_iter()
        .enumerate()
    {
        let mut batch = Batch {
            version: PolicyVersion(0),
            groups: Vec::new(),
        };
        let mut tokens = 0usize;
        for g in 0..groups {
            let start = ((rep * 7 + g) * group) % trajs.len().max(1);
            let samples: Vec<(Trajectory, f64)> = (0..group)
                .map(|i| {
                    let t = trajs[(start + i) % trajs.len()].clone();
                    tokens += t.tokens.len();
                    // Mixed rewards, so advantages are non-zero as in a real batch.
                    (t, (i % 2) as f64)
                })
                .collect();
            batch.groups.push(BatchGroup {
                key: GroupKey(g as u64),
                start: PolicyVersion(0),
                samples,
            });
        }
        let t0 = Instant::now();
        learner.train(&batch)?;
        let secs = t0.elapsed().as_secs_f64();
        // The first step pays one-time costs (allocations, thread start): not fitted.
        if rep > 0 {
            points.push((tokens as f64, secs));
        }
        last = Some((batch, tokens));
    }
    let (batch, tokens) = last.context("no calibration batch")?;
    let rows: Vec<([f64; 4], f64)> = points
        .iter()
        .map(|&(tok, s)| ([1.0, tok, 0.0, 0.0], s))
        .collect();
    let mut c = least_squares(&rows, &[true, true, false, false]);
    if c[0] < 0.0 || c[1] < 0.0 {
        // Noise swamped the intercept: proportional fit through the origin.
        c = least_squares(&rows, &[false, true, false, false]);
    }
    let cost = TrainCost {
        step_s: c[0].max(0.0),
        token_s: c[1].max(0.0),
        parallel_efficiency: 1.0,
    };
    Ok((cost, learner, batch, tokens))
}

/// Runs the engine (generating continuously on the run's prompts, in its own thread) and the
/// learner at the same time, and returns how much slower each was than its fitted cost
/// alone: the contention of sharing this machine's cores, caches and memory bandwidth.
#[allow(clippy::too_many_arguments)]
fn time_contention(
    model: &Arc<rollflash_model::model::Transformer>,
    threads: usize,
    max_running: usize,
    prompts: &[Vec<u32>],
    sampling: &SamplingParams,
    inference: &InferenceCost,
    training: &TrainCost,
    learner: &mut PolicyLearner,
    batch: &Batch<Trajectory>,
    tokens: usize,
) -> Result<(f64, f64)> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    let (gen_steps, train_times) = std::thread::scope(|s| -> Result<_> {
        let engine = s.spawn(|| -> Result<Vec<StepSample>> {
            let mut e = Engine::new(
                Arc::clone(model),
                PolicyVersion(0),
                EngineConfig {
                    max_running_requests: max_running,
                    threads,
                    ..Default::default()
                },
            )?;
            let mut next = 0usize;
            // Per live request: prompt length and tokens generated so far.
            let mut lens: std::collections::HashMap<u64, (usize, usize)> = Default::default();
            let mut steps = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                while e.num_running() + e.num_waiting() < max_running {
                    let p = &prompts[next % prompts.len()];
                    lens.insert(next as u64, (p.len(), 0));
                    e.submit(EngineRequest {
                        id: RequestId(next as u64),
                        prompt: p.clone(),
                        params: SamplingParams {
                            seed: Some(next as u64),
                            ..sampling.clone()
                        },
                        resume: None,
                    })?;
                    next += 1;
                }
                let t0 = Instant::now();
                let out = e.step()?;
                let secs = t0.elapsed().as_secs_f64();
                let (mut context, mut decoding) = (0, 0);
                for (id, _) in &out.new_tokens {
                    if let Some((p, g)) = lens.get_mut(&id.0) {
                        context += *p + *g;
                        if *g > 0 {
                            decoding += 1;
                        }
                        *g += 1;
                    }
                }
                for c in &out.finished {
                    lens.remove(&c.id.0);
                }
                started.store(true, Ordering::Relaxed);
                if !out.new_tokens.is_empty() {
                    steps.push(StepSample {
                        batch: out.new_tokens.len() as f64,
                        context: context as f64,
                        prefill: out.forward_tokens.saturating_sub(decoding) as f64,
                        secs,
                    });
                }
            }
            Ok(steps)
        });
        while !started.load(Ordering::Relaxed) && !engine.is_finished() {
            std::thread::yield_now();
        }
        let mut times = Vec::new();
        let mut result = Ok(());
        for _ in 0..3 {
            let t0 = Instant::now();
            if let Err(e) = learner.train(batch) {
                result = Err(anyhow::anyhow!("learner: {e}"));
                break;
            }
            times.push(t0.elapsed().as_secs_f64());
        }
        stop.store(true, Ordering::Relaxed);
        let steps = engine
            .join()
            .map_err(|_| anyhow::anyhow!("calibration engine thread panicked"))??;
        result?;
        Ok((steps, times))
    })?;
    let predicted: f64 = gen_steps
        .iter()
        .map(|s| {
            inference.step_time(s.batch as u64, s.context as u64, 0)
                + inference.prefill_token_s * s.prefill
        })
        .sum();
    let measured: f64 = gen_steps.iter().map(|s| s.secs).sum();
    let train_alone = training.step_time(tokens as u64, 1);
    let train_together = train_times.iter().sum::<f64>() / train_times.len().max(1) as f64;
    Ok((
        (measured / predicted.max(1e-12)).max(1.0),
        (train_together / train_alone.max(1e-12)).max(1.0),
    ))
}
