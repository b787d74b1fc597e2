//! `rollflash bench`: the synchronous baseline and each ROLL Flash mechanism alone and
//! combined, measured side by side in one process, on the same threads, model and number of
//! trained samples, on two workloads — long-tailed RLVR math and agentic FrozenLake behind
//! slow, failing environments.
//!
//! Every mode is the real stack (engines behind the `LlmProxy`, the `EnvManager`, the
//! `AsyncController` with the `PolicyLearner`); a mode only flips switches:
//!
//! | switch | on (ROLL Flash) | off (the synchronous baseline) |
//! | --- | --- | --- |
//! | queue scheduling | continuous batching: a freed slot takes the next request at once | [`WaveBackend`]: static batches of `max_running_requests`; a batch admits nothing new until its slowest request finished |
//! | prompt replication | `Replication::Expand`: a group's samples are independent requests on any engine | `Replication::PerRequest`: the whole group pinned to one engine |
//! | α | `buffer.alpha = α`, rollout runs during training | α = 0 with the barrier |
//! | environment-level async | a trajectory waiting on its environment holds no generation slot | [`SlotEnv`]: a trajectory holds one of the engines' slots from `reset` to its end, env waits included |
//! | redundant environments | `group_size + rollout.group_size_redundancy` trajectories, first `group_size` kept | exactly `group_size` |
//!
//! Throughput is trained samples (and trained model tokens) per second in steady state, from
//! the first weight publication to the last (the whole run's figure is in the CSV);
//! utilisation comes from the controller's step records over the same window.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use rollflash_core::buffer::Schedule;
use rollflash_core::{FinishReason, GenOutput, GenRequest, PauseMode, PolicyVersion, RequestId};
use rollflash_env::{Env, EnvError, Reset, Step};
use rollflash_rollout::{Backend, BackendError, BackendLoad, Replication, WeightUpdate};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use rollflash_core::IoError;
use rollflash_run::config::{ConfigError, TrainConfig};
use rollflash_run::pipeline::PipelineError;
use rollflash_run::plan::RunPlan;
use rollflash_run::stack::{self, Policy, Stack, StackHooks, WarmedUp, WrapEnv};
use rollflash_trainer::learner::PolicyLearner;
use rollflash_trainer::{AsyncController, RunReport, StopFlag};

/// The SmolLM2 workload's model directory and data, relative to the working directory.
const SMOLLM2_DIR: &str = "models/smollm2-hf";
const CHAIN_SUM_TRAIN: &str = "data/reasoning_gym/chain_sum_train.jsonl";

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("warm-up")]
    Warmup(#[from] PipelineError),
    #[error(transparent)]
    Plan(#[from] rollflash_run::plan::PlanError),
    #[error(transparent)]
    Stack(#[from] rollflash_run::stack::StackError),
    #[error("model")]
    Model(#[from] rollflash_model::ModelError),
    #[error("tensor")]
    Tensor(#[from] candle_core::Error),
    #[error("rollout")]
    Backend(#[from] BackendError),
    #[error("proxy")]
    Proxy(#[from] rollflash_rollout::ProxyError),
    #[error("environment")]
    Env(#[from] EnvError),
    #[error(transparent)]
    Controller(#[from] rollflash_trainer::ControllerError),
    #[error("learner")]
    Learner(#[from] rollflash_trainer::LearnerError),
    #[error("plot")]
    Plot(#[from] rollflash_plot::PlotError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Sandbox(#[from] rollflash_sandbox::SandboxError),
    /// A workload's files are not where it reads them.
    #[error(
        "workload `{workload}` needs {path} (run from the repository root; make it with {how})"
    )]
    Missing {
        workload: &'static str,
        path: &'static str,
        how: &'static str,
    },
    #[error("unknown mode `{0}` (known: {known})", known = MODE_NAMES.join(", "))]
    UnknownMode(String),
}

/// The workloads: the two kinds the paper reports on, and an agentic one where generation,
/// not environment waits, takes most of a trajectory's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// The arithmetic task with 2–24 terms (power-law term count): a few responses are ten
    /// times longer than most.
    Rlvr,
    /// Multi-turn FrozenLake behind log-normal environment latency and injected failures.
    Agentic,
    /// The same multi-turn FrozenLake with long model turns and short environment
    /// latency, so generation is most of a trajectory's time (as in the paper's agentic
    /// runs, where the model writes long reasoning per turn): the agentic speed-up where it
    /// is not just sleeping environments overlapping.
    AgenticGen,
    /// The multi-turn coding environment: every model turn is a program run in the code
    /// sandbox against the task's tests, and a failing one is answered with its error and
    /// another turn, so executions (a fresh sandbox each) are a real part of a trajectory.
    /// Random weights: the whole response is the program, which rarely parses.
    Code,
    /// A real model where training dominates: SmolLM2-135M-Instruct on reasoning-gym's
    /// chain_sum, 4 prompts × 8 samples, 64 new tokens (issue 35's measurement). Reads
    /// `models/smollm2-hf` and `data/reasoning_gym/` under the working directory, so it is
    /// not part of `all`.
    Smollm2,
}

impl Workload {
    /// Every workload, in the order `all` runs them.
    pub const ALL: [Workload; 4] = [
        Workload::Rlvr,
        Workload::Agentic,
        Workload::AgenticGen,
        Workload::Code,
    ];

    /// Every workload a name selects: [`Workload::ALL`] and those needing files of the
    /// user's (`smollm2`).
    pub const KNOWN: [Workload; 5] = [
        Workload::Rlvr,
        Workload::Agentic,
        Workload::AgenticGen,
        Workload::Code,
        Workload::Smollm2,
    ];

    /// `rlvr`, `agentic`, `agentic-gen`, `code` or `smollm2`.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Rlvr => "rlvr",
            Workload::Agentic => "agentic",
            Workload::AgenticGen => "agentic-gen",
            Workload::Code => "code",
            Workload::Smollm2 => "smollm2",
        }
    }

    /// Writes the data the workload reads under `out` and returns the settings naming it
    /// (after [`Workload::sets`]); none for the workloads whose tasks are generated.
    ///
    /// `code`: 32 HumanEval-shaped rows (a one-line function to complete, one `assert`),
    /// short enough that two attempts and the feedback between them fit the built-in
    /// model's 512 positions.
    pub fn data(self, out: &Path) -> Result<Vec<String>, BenchError> {
        match self {
            Workload::Rlvr | Workload::Agentic | Workload::AgenticGen => Ok(Vec::new()),
            Workload::Smollm2 => {
                for (path, how) in [
                    (
                        SMOLLM2_DIR,
                        "scripts/fetch_smollm2.sh, then rollflash convert-gguf \
                         models/smollm2-135m-instruct.Q4_1.gguf models/smollm2-hf",
                    ),
                    (
                        CHAIN_SUM_TRAIN,
                        "scripts/make_reasoning_gym_data.sh data/reasoning_gym",
                    ),
                ] {
                    if !Path::new(path).exists() {
                        return Err(BenchError::Missing {
                            workload: self.name(),
                            path,
                            how,
                        });
                    }
                }
                Ok(Vec::new())
            }
            Workload::Code => {
                std::fs::create_dir_all(out).map_err(IoError::at("cannot create", out))?;
                let path = out.join("code_tasks.jsonl");
                let rows: String = (0..32)
                    .map(|i| {
                        let (k, c) = (i % 7 + 2, i / 7);
                        let row = serde_json::json!({
                            "task_id": format!("bench/{i}"),
                            "prompt": format!("def f(x):\n    \"\"\"Return x*{k}+{c}.\"\"\"\n"),
                            "test": format!("def check(g):\n    assert g(3) == {}\n", 3 * k + c),
                            "entry_point": "f",
                        });
                        format!("{row}\n")
                    })
                    .collect();
                std::fs::write(&path, rows).map_err(IoError::at("cannot write", &path))?;
                let path = serde_json::to_string(&path.display().to_string()).unwrap_or_default();
                Ok(vec![format!("env.files=[{{ path = {path} }}]")])
            }
        }
    }

    /// The workloads a `--workload` value names: one by [`Workload::name`], `both` (the
    /// paper's two: `rlvr` and `agentic`) or `all`.
    pub fn parse_list(s: &str) -> Option<Vec<Workload>> {
        match s {
            "both" => Some(vec![Workload::Rlvr, Workload::Agentic]),
            "all" => Some(Workload::ALL.to_vec()),
            _ => Workload::KNOWN
                .into_iter()
                .find(|w| w.name() == s)
                .map(|w| vec![w]),
        }
    }

    /// The workload's settings, as `--set` overrides of the `rollflash train` defaults (so
    /// they are validated like any config, and printed with the table).
    ///
    /// Both: two engine workers and the automatic core split (`rollflash_run::cores`: on
    /// the 2-core machine one thread per engine and a two-thread trainer, so either stage
    /// uses the whole machine in the synchronous baseline), engine slots fewer
    /// than a batch's samples (so static batching and slot-holding environments cost what
    /// they cost on a GPU whose KV cache bounds the batch), no evaluation, no report.
    pub fn sets(self) -> Vec<String> {
        let common = [
            "rollout.engines=2",
            "train.eval_problems=0",
            "train.eval_samples=0",
            "metrics.progress=false",
            "metrics.report=false",
        ];
        let specific: &[&str] = match self {
            // Default math task (2–24 terms, exponent 1.5); a short cached warm-up so
            // response lengths follow the problems instead of running to the token limit.
            Workload::Rlvr => &[
                "env.name=\"math\"",
                "env.max_terms=24",
                "warmup.steps=40",
                "warmup.batch_size=16",
                "rollout.max_running_requests=8",
                "rollout.max_new_tokens=320",
                "rollout.max_total_tokens=448",
                "buffer.groups_per_batch=4",
                "buffer.group_size=8",
                "train.steps=4",
            ],
            // Environment latency scaled down from the paper's 1–2 s (log-normal mean
            // 0.5 s, σ = 1: p99 ≈ 3 s, capped at 4 s) so a run takes seconds, yet
            // environment waits still dominate a trajectory; 2% of calls fail. Random
            // weights: every turn is 8 tokens, every episode `max_steps` turns.
            Workload::Agentic => &[
                "env.name=\"frozen_lake\"",
                "env.map={ random = { size = 4, p = 0.8 } }",
                "env.is_slippery=false",
                "env.max_steps=3",
                "env.latency={ kind = \"log_normal\", mean = 0.5, sigma = 1.0, cap_secs = 4.0 }",
                "env.failure={ rate = 0.02 }",
                "warmup.steps=0",
                "rollout.max_running_requests=2",
                "rollout.max_new_tokens=8",
                "rollout.max_turns=3",
                "rollout.max_total_tokens=320",
                "rollout.temperature=1.0",
                "rollout.group_size_redundancy=2",
                "buffer.groups_per_batch=2",
                "buffer.group_size=4",
                "train.steps=4",
            ],
            // Model turns of 48 tokens (random weights rarely stop early) against a
            // log-normal environment latency of mean 0.025 s (σ = 1, capped at 0.25 s), no
            // injected failures: in the synchronous baseline waiting for the model is well
            // over half of a trajectory's time (the `gen share` column measures it). The
            // latency was 0.05 s until the engine's decode got faster and brought the
            // baseline's gen share down to about half (BENCHMARKS.md).
            Workload::AgenticGen => &[
                "env.name=\"frozen_lake\"",
                "env.map={ random = { size = 4, p = 0.8 } }",
                "env.is_slippery=false",
                "env.max_steps=3",
                "env.latency={ kind = \"log_normal\", mean = 0.025, sigma = 1.0, cap_secs = 0.25 }",
                "warmup.steps=0",
                "rollout.max_running_requests=4",
                "rollout.max_new_tokens=48",
                "rollout.max_turns=3",
                "rollout.max_total_tokens=448",
                "rollout.temperature=1.0",
                "rollout.group_size_redundancy=2",
                "buffer.groups_per_batch=2",
                "buffer.group_size=4",
                "train.steps=4",
            ],
            // Two attempts per task, each a 48-token turn and an execution in the sandbox
            // (its default limits, two workers); the files come from `data`.
            Workload::Code => &[
                "env.name=\"dataset\"",
                "env.reward=\"code\"",
                "env.code_extract=\"whole\"",
                "env.attempts=2",
                "env.answer=\"test\"",
                "env.id=\"task_id\"",
                "warmup.steps=0",
                "rollout.max_running_requests=4",
                "rollout.max_new_tokens=48",
                "rollout.max_turns=2",
                "rollout.max_total_tokens=448",
                "rollout.temperature=1.0",
                "rollout.group_size_redundancy=2",
                "buffer.groups_per_batch=2",
                "buffer.group_size=4",
                "train.steps=4",
            ],
            // Issue 35's sizes: the model's own chat template, the verifier's last number,
            // lr 2e-5; training is most of a step.
            Workload::Smollm2 => &[
                "model.path=\"models/smollm2-hf\"",
                "env.name=\"dataset\"",
                "env.files=[{ path = \"data/reasoning_gym/chain_sum_train.jsonl\" }]",
                "env.prompt=\"question\"",
                "env.answer=\"answer\"",
                "env.id=\"id\"",
                "env.template=\"{question}\"",
                "env.extract=[\"boxed\", \"last_number\"]",
                "warmup.steps=0",
                "rollout.temperature=1.0",
                "rollout.max_new_tokens=64",
                "rollout.max_total_tokens=192",
                "rollout.max_running_requests=16",
                "buffer.groups_per_batch=4",
                "buffer.group_size=8",
                "train.lr=2e-5",
                "train.micro_batch_size=8",
                "train.steps=10",
            ],
        };
        common
            .iter()
            .chain(specific)
            .map(|s| (*s).to_string())
            .collect()
    }

    /// The modes run when `--modes` is not given.
    pub fn default_modes(self) -> &'static [&'static str] {
        match self {
            Workload::Rlvr => &["sync", "queue", "replicate", "alpha1", "alpha2", "all"],
            Workload::Smollm2 => &["sync", "alpha1", "all"],
            Workload::Agentic | Workload::AgenticGen | Workload::Code => {
                &["sync", "queue", "env-async", "redundant", "alpha1", "all"]
            }
        }
    }
}

/// One configuration of the mechanisms.
#[derive(Debug, Clone, PartialEq)]
pub struct Mode {
    pub name: String,
    /// 0 is the synchronous baseline (α = 0 and the barrier: no generation during training).
    pub alpha: f64,
    /// Queue scheduling (continuous batching) instead of static batches.
    pub queue: bool,
    /// Prompt replication (`Expand`) instead of a group pinned to one engine.
    pub replicate: bool,
    /// Environment waits hold no generation slot.
    pub env_async: bool,
    /// Redundant trajectories per group (`rollout.group_size_redundancy`).
    pub redundant: bool,
}

/// Every mode name [`mode`] knows.
pub const MODE_NAMES: &[&str] = &[
    "sync",
    "queue",
    "replicate",
    "env-async",
    "redundant",
    "alpha1",
    "alpha2",
    "alpha4",
    "all-sync",
    "all-a1",
    "all",
];

/// The mode called `name`: `sync` (the baseline), one mechanism alone on top of it
/// (`queue`, `replicate`, `env-async`, `redundant`, `alpha1|2|4`), or every mechanism
/// (`all-sync` at α = 0, `all-a1` at α = 1, `all` at α = 2).
pub fn mode(name: &str) -> Option<Mode> {
    let base = Mode {
        name: name.to_string(),
        alpha: 0.0,
        queue: false,
        replicate: false,
        env_async: false,
        redundant: false,
    };
    let every = |alpha| Mode {
        alpha,
        queue: true,
        replicate: true,
        env_async: true,
        redundant: true,
        ..base.clone()
    };
    Some(match name {
        "sync" => base,
        "queue" => Mode {
            queue: true,
            ..base
        },
        "replicate" => Mode {
            replicate: true,
            ..base
        },
        "env-async" => Mode {
            env_async: true,
            ..base
        },
        "redundant" => Mode {
            redundant: true,
            ..base
        },
        "alpha1" => Mode { alpha: 1.0, ..base },
        "alpha2" => Mode { alpha: 2.0, ..base },
        "alpha4" => Mode { alpha: 4.0, ..base },
        "all-sync" => every(0.0),
        "all-a1" => every(1.0),
        "all" => every(2.0),
        _ => return None,
    })
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub workloads: Vec<Workload>,
    /// Mode names; `None` runs each workload's defaults. `sync` is always run (speed-ups
    /// are relative to it).
    pub modes: Option<Vec<String>>,
    /// Runs per mode; the table shows min / median / max.
    pub repeats: usize,
    /// Training steps per run (overrides the workload's `train.steps`).
    pub steps: Option<usize>,
    /// Extra `--set key=value` overrides, applied to every workload after its own.
    pub sets: Vec<String>,
    /// Where the warm-up cache, `bench.csv`, `bench.md` and the charts go.
    pub out: PathBuf,
    /// Print one line per run.
    pub verbose: bool,
}

/// One run of one mode.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub repeat: usize,
    /// Trained samples per second in the measurement window (see
    /// [`Measurement::from_report`]).
    pub samples_per_s: f64,
    /// Trained model (response) tokens per second, same window.
    pub tokens_per_s: f64,
    /// The window's length in seconds.
    pub window_s: f64,
    /// Trained samples per second from the start to the last publication.
    pub run_samples_per_s: f64,
    pub steps: usize,
    pub trained: u64,
    /// Mean model tokens per trained sample (in the window).
    pub mean_response_tokens: f64,
    /// Fraction of the wall time in which some rollout group was generating (not paused
    /// for a weight sync, not blocked by admission).
    pub rollout_busy: f64,
    /// Fraction of the wall time the trainer spent in training steps.
    pub trainer_busy: f64,
    /// Of the trained trajectories' time, the share spent waiting for model turns
    /// (queueing included) rather than in environment steps.
    pub gen_share: f64,
    /// Largest staleness (version − start version) of any trained sample.
    pub staleness_max: u64,
    /// Mean staleness over trained samples.
    pub staleness_mean: f64,
    pub accounting: rollflash_core::buffer::Accounting,
}

impl Measurement {
    /// From a run's step records. With three or more steps the window is steady state:
    /// from the first weight publication to the last, so the fill at the start (an async
    /// mode generates up to α + 1 batches before its first step ends) and the aborted
    /// surplus at the end weigh on no mode; `run_samples_per_s` keeps the whole run.
    fn from_report(report: &RunReport, repeat: usize) -> Self {
        let steps = &report.steps;
        let last = steps
            .last()
            .map_or(report.wall, |s| s.elapsed)
            .as_secs_f64();
        let (window, from) = match steps.first() {
            Some(first) if steps.len() >= 3 => (last - first.elapsed.as_secs_f64(), 1),
            _ => (last, 0),
        };
        let window = window.max(1e-9);
        let counted = &steps[from.min(steps.len())..];
        let samples: usize = counted.iter().map(|s| s.samples).sum();
        let tokens: usize = counted.iter().map(|s| s.tokens).sum();
        let idle: f64 = counted.iter().map(|s| s.rollout_idle.as_secs_f64()).sum();
        let train: f64 = counted.iter().map(|s| s.train.as_secs_f64()).sum();
        let generate: f64 = counted.iter().map(|s| s.turn_generate.as_secs_f64()).sum();
        let env: f64 = counted.iter().map(|s| s.turn_env.as_secs_f64()).sum();
        let all_samples: usize = steps.iter().map(|s| s.samples).sum();
        let stale_sum: f64 = steps.iter().map(|s| s.staleness * s.samples as f64).sum();
        Measurement {
            repeat,
            samples_per_s: samples as f64 / window,
            tokens_per_s: tokens as f64 / window,
            window_s: window,
            run_samples_per_s: all_samples as f64 / last.max(1e-9),
            steps: steps.len(),
            trained: all_samples as u64,
            mean_response_tokens: tokens as f64 / samples.max(1) as f64,
            rollout_busy: (1.0 - idle / window).clamp(0.0, 1.0),
            trainer_busy: (train / window).clamp(0.0, 1.0),
            gen_share: generate / (generate + env).max(1e-9),
            staleness_max: steps.iter().map(|s| s.staleness_max).max().unwrap_or(0),
            staleness_mean: stale_sum / all_samples.max(1) as f64,
            accounting: report.accounting,
        }
    }
}

/// All runs of one mode on one workload.
#[derive(Debug, Clone)]
pub struct ModeResult {
    pub workload: Workload,
    pub mode: Mode,
    pub runs: Vec<Measurement>,
}

/// Min, median and max.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    /// Of `xs` (all zero when empty).
    pub fn of(xs: impl IntoIterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = xs.into_iter().collect();
        if v.is_empty() {
            return Spread {
                min: 0.0,
                median: 0.0,
                max: 0.0,
            };
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            min: v[0],
            median,
            max: v[n - 1],
        }
    }
}

impl ModeResult {
    /// Samples/s over the repeats.
    pub fn samples_per_s(&self) -> Spread {
        Spread::of(self.runs.iter().map(|m| m.samples_per_s))
    }
}

/// Everything one `rollflash bench` measured.
#[derive(Debug, Clone)]
pub struct BenchReport {
    pub results: Vec<ModeResult>,
    /// The settings each workload ran with (its `--set` list).
    pub settings: Vec<(Workload, Vec<String>)>,
    pub repeats: usize,
}

impl BenchReport {
    /// The result of `mode` on `workload`.
    pub fn get(&self, workload: Workload, mode: &str) -> Option<&ModeResult> {
        self.results
            .iter()
            .find(|r| r.workload == workload && r.mode.name == mode)
    }

    /// Speed-up of `r` over its workload's `sync`: the ratio of medians, and the range of
    /// the ratios of runs paired by repeat.
    pub fn speedup(&self, r: &ModeResult) -> Option<Spread> {
        let base = self.get(r.workload, "sync")?;
        let b = base.samples_per_s().median;
        if b <= 0.0 {
            return None;
        }
        let paired = Spread::of(
            r.runs
                .iter()
                .zip(&base.runs)
                .map(|(m, s)| m.samples_per_s / s.samples_per_s.max(1e-9)),
        );
        Some(Spread {
            median: r.samples_per_s().median / b,
            ..paired
        })
    }

    /// The table as Markdown, one block per workload.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        for (w, sets) in &self.settings {
            s.push_str(&format!(
                "### {} ({} repeats; min / median / max)\n\nsettings: `{}`\n\n",
                w.name(),
                self.repeats,
                sets.join(" ")
            ));
            s.push_str(
                "| mode | α | Q | R | E | D | samples/s | tokens/s | speed-up | rollout busy | trainer busy | gen share | staleness max | staleness mean | resp. tokens | accounting |\n",
            );
            s.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
            for r in self.results.iter().filter(|r| r.workload == *w) {
                let sp = self.speedup(r);
                let tick = |b: bool| if b { "✓" } else { "·" };
                let acc = r.runs.iter().fold((0u64, 0u64, true), |a, m| {
                    (
                        a.0 + m.accounting.started,
                        a.1 + m.accounting.trained,
                        a.2 && m.accounting.balanced(),
                    )
                });
                s.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {} started, {} trained{} |\n",
                    r.mode.name,
                    r.mode.alpha,
                    tick(r.mode.queue),
                    tick(r.mode.replicate),
                    tick(r.mode.env_async),
                    tick(r.mode.redundant),
                    fmt3(r.samples_per_s(), 1),
                    fmt3(Spread::of(r.runs.iter().map(|m| m.tokens_per_s)), 0),
                    sp.map_or("–".into(), |x| format!(
                        "**{:.2}×** ({:.2}–{:.2})",
                        x.median, x.min, x.max
                    )),
                    fmt3(Spread::of(r.runs.iter().map(|m| m.rollout_busy)), 2),
                    fmt3(Spread::of(r.runs.iter().map(|m| m.trainer_busy)), 2),
                    fmt3(Spread::of(r.runs.iter().map(|m| m.gen_share)), 2),
                    r.runs.iter().map(|m| m.staleness_max).max().unwrap_or(0),
                    fmt3(Spread::of(r.runs.iter().map(|m| m.staleness_mean)), 2),
                    Spread::of(r.runs.iter().map(|m| m.mean_response_tokens)).median,
                    acc.0,
                    acc.1,
                    if acc.2 { ", balanced" } else { ", NOT balanced" },
                ));
            }
            s.push_str(
                "\nQ queue scheduling, R prompt replication, E environment-level async, D redundant environments (✓ on, · off).\n\n",
            );
        }
        s
    }

    /// One CSV row per run.
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "workload,mode,alpha,queue,replicate,env_async,redundant,repeat,samples_per_s,tokens_per_s,window_s,run_samples_per_s,steps,trained,mean_response_tokens,rollout_busy,trainer_busy,gen_share,staleness_max,staleness_mean,started,aborted,failed,dropped_stale,balanced\n",
        );
        for r in &self.results {
            for m in &r.runs {
                let a = &m.accounting;
                s.push_str(&format!(
                    "{},{},{},{},{},{},{},{},{:.3},{:.1},{:.3},{:.3},{},{},{:.1},{:.4},{:.4},{:.4},{},{:.4},{},{},{},{},{}\n",
                    r.workload.name(),
                    r.mode.name,
                    r.mode.alpha,
                    r.mode.queue,
                    r.mode.replicate,
                    r.mode.env_async,
                    r.mode.redundant,
                    m.repeat,
                    m.samples_per_s,
                    m.tokens_per_s,
                    m.window_s,
                    m.run_samples_per_s,
                    m.steps,
                    m.trained,
                    m.mean_response_tokens,
                    m.rollout_busy,
                    m.trainer_busy,
                    m.gen_share,
                    m.staleness_max,
                    m.staleness_mean,
                    a.started,
                    a.aborted,
                    a.failed,
                    a.dropped_stale,
                    a.balanced(),
                ));
            }
        }
        s
    }

    /// Writes `bench.md`, `bench.csv` and `speedup_vs_alpha.png` (samples/s over α for the
    /// `sync` / `alphaN` modes of each workload, when at least two were run) under `dir`.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
        std::fs::create_dir_all(dir).map_err(IoError::at("cannot create", dir))?;
        let mut written = Vec::new();
        for (name, text) in [("bench.md", self.markdown()), ("bench.csv", self.csv())] {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(IoError::at("cannot write", path.clone()))?;
            written.push(path);
        }
        let mut chart = rollflash_plot::Chart::new(
            "Speed-up over synchronous vs α (mechanism α alone)",
            "α",
            "speed-up (median samples/s ÷ sync)",
        );
        for (w, _) in &self.settings {
            let points: Vec<(f64, f64)> = self
                .results
                .iter()
                .filter(|r| {
                    r.workload == *w && (r.mode.name == "sync" || r.mode.name.starts_with("alpha"))
                })
                .filter_map(|r| Some((r.mode.alpha, self.speedup(r)?.median)))
                .collect();
            if points.len() >= 2 {
                chart = chart.with(rollflash_plot::Series::new(w.name(), points));
            }
        }
        if !chart.series.is_empty() {
            let path = dir.join("speedup_vs_alpha.png");
            rollflash_plot::line_chart(&path, &chart)?;
            written.push(path);
        }
        Ok(written)
    }
}

fn fmt3(s: Spread, decimals: usize) -> String {
    format!(
        "{:.d$} / {:.d$} / {:.d$}",
        s.min,
        s.median,
        s.max,
        d = decimals
    )
}

/// The plan and the starting policy of one workload: the built-in model from the config's
/// seed, after the warm-up the plan asks for (cached under the output directory, as
/// `rollflash train` caches it).
async fn prepare(cfg: TrainConfig) -> Result<(RunPlan, Policy), BenchError> {
    let plan = RunPlan::new(cfg)?;
    if let (Some(config), Some(data)) = (plan.sandbox(), plan.data()) {
        // As `rollflash train` does: the task's every environment shares this sandbox.
        data.set_sandbox(rollflash_sandbox::Sandbox::new(config.clone()).await?);
    }
    let mut policy = Policy::load(&plan)?;
    let mut model = policy.trainable(&plan)?;
    if let WarmedUp::Reused(dir) = stack::warm_up(&plan, &policy, &mut model, &StopFlag::new())
        .await
        .map_err(PipelineError::from)?
    {
        println!("warm-up: reused {}", dir.display());
    }
    policy.weights = model.weights();
    Ok((plan, policy))
}

/// Runs every requested mode of every workload `repeats` times, interleaved (each round
/// runs every mode once, in alternating order, so drift in the machine's load spreads over
/// all modes), and writes the results under `opts.out`.
pub async fn run(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    let mut plans: Vec<(Workload, RunPlan, Policy, Vec<Mode>)> = Vec::new();
    let mut settings = Vec::new();
    for &w in &opts.workloads {
        let mut sets = w.sets();
        sets.extend(w.data(&opts.out)?);
        if let Some(steps) = opts.steps {
            sets.push(format!("train.steps={steps}"));
        }
        sets.extend(opts.sets.iter().cloned());
        let mut cfg = TrainConfig::load(None, &sets)?;
        cfg.output_dir = opts.out.clone();
        let names: Vec<String> = match &opts.modes {
            Some(m) => m.clone(),
            None => w.default_modes().iter().map(|s| (*s).to_string()).collect(),
        };
        let mut modes = vec![mode("sync").ok_or_else(|| BenchError::UnknownMode("sync".into()))?];
        for n in names {
            let m = mode(&n).ok_or_else(|| BenchError::UnknownMode(n.clone()))?;
            if !modes.iter().any(|x| x.name == m.name) {
                modes.push(m);
            }
        }
        let started = Instant::now();
        let warmup = cfg.warmup.steps;
        let (run_plan, policy) = prepare(cfg).await?;
        if warmup > 0 {
            println!(
                "{}: policy ready in {:.0}s",
                w.name(),
                started.elapsed().as_secs_f64()
            );
        }
        settings.push((w, sets));
        plans.push((w, run_plan, policy, modes));
    }
    let mut results: Vec<ModeResult> = plans
        .iter()
        .flat_map(|(w, _, _, modes)| {
            modes.iter().map(|m| ModeResult {
                workload: *w,
                mode: m.clone(),
                runs: Vec::new(),
            })
        })
        .collect();
    let repeats = opts.repeats.max(1);
    for r in 0..repeats {
        let mut order: Vec<usize> = (0..results.len()).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (w, m) = (results[i].workload, results[i].mode.clone());
            let Some((_, run_plan, policy, _)) = plans.iter().find(|p| p.0 == w) else {
                continue;
            };
            let t0 = Instant::now();
            let meas = run_mode(run_plan, &m, policy, r).await?;
            if opts.verbose {
                println!(
                    "[{} {}/{}] {:<10} {:>7.2} samples/s {:>8.0} tokens/s  rollout busy {:.2}  trainer busy {:.2}  gen share {:.2}  staleness max {} mean {:.2}  ({:.1}s)",
                    w.name(),
                    r + 1,
                    repeats,
                    m.name,
                    meas.samples_per_s,
                    meas.tokens_per_s,
                    meas.rollout_busy,
                    meas.trainer_busy,
                    meas.gen_share,
                    meas.staleness_max,
                    meas.staleness_mean,
                    t0.elapsed().as_secs_f64()
                );
            }
            results[i].runs.push(meas);
        }
    }
    Ok(BenchReport {
        results,
        settings,
        repeats,
    })
}

/// One run of `mode` on the workload `base` plans, from `policy`: the plan with the mode's
/// mechanisms switched on or off, built by the same stack `rollflash train` builds.
async fn run_mode(
    base: &RunPlan,
    mode: &Mode,
    policy: &Policy,
    repeat: usize,
) -> Result<Measurement, BenchError> {
    let plan = base
        .clone()
        .with_schedule(Schedule::from_alpha(mode.alpha))?
        .with_redundancy(if mode.redundant {
            base.controller().core.redundancy
        } else {
            0
        })
        .with_replication(if mode.replicate {
            Replication::Expand
        } else {
            Replication::PerRequest
        })
        // The same task stream and sampling in every mode of a repeat.
        .with_repeat(repeat);
    // The wave's size is an engine's slots; the slot pool is every engine's.
    let cap = plan
        .backends()
        .iter()
        .map(|b| match b {
            rollflash_run::plan::BackendPlan::Engine {
                max_running_requests,
                ..
            } => *max_running_requests,
            rollflash_run::plan::BackendPlan::Remote { .. } => 0,
        })
        .max()
        .unwrap_or(1);
    let slots_total = plan.engine_slots();
    let hooks = StackHooks {
        wrap_backend: (!mode.queue).then(|| {
            Box::new(move |b: Arc<dyn Backend>| {
                Arc::new(WaveBackend::new(b, cap)) as Arc<dyn Backend>
            }) as Box<dyn Fn(Arc<dyn Backend>) -> Arc<dyn Backend> + Send + Sync>
        }),
        wrap_env: (!mode.env_async).then(|| {
            let slots = Arc::new(Semaphore::new(slots_total));
            Arc::new(move |inner: Box<dyn Env>| {
                Box::new(SlotEnv {
                    inner,
                    slots: Arc::clone(&slots),
                    permit: None,
                }) as Box<dyn Env>
            }) as WrapEnv
        }),
        timeline: None,
    };
    let model = policy.trainable(&plan)?;
    let stack = Stack::build_with(&plan, policy, &model, PolicyVersion(0), &hooks)?;
    let learner = PolicyLearner::new(model, plan.learner().clone())?;
    let ctl = AsyncController::new(
        plan.controller().clone(),
        stack.proxy.handle(),
        stack.envs.clone(),
        Arc::clone(&stack.make),
        stack.version.clone(),
        learner,
    )?
    .with_success_threshold(plan.success_threshold());
    let outcome = ctl.run().await;
    // Shut the engines down whatever happened, then report.
    stack.proxy.shutdown().await?;
    Ok(Measurement::from_report(&outcome?, repeat))
}

/// Batch-synchronous generation in front of a backend: requests are served in static
/// batches ("waves") of up to `cap`. A wave admits requests until it is full; once full it
/// admits nothing until every member finished, so a wave lasts as long as its slowest
/// response — what `generate(list_of_prompts)` with a batch size does, and what queue
/// scheduling removes. Waiting requests hold the proxy's slot on this backend, as they
/// would be part of the caller's batch.
pub struct WaveBackend {
    inner: Arc<dyn Backend>,
    cap: usize,
    /// A tiny critical section (counters and a map), never held across an await.
    state: Mutex<WaveState>,
    changed: Notify,
}

#[derive(Default)]
struct WaveState {
    /// Requests of the current wave still generating.
    members: usize,
    /// The wave reached `cap`: no one joins until it drains.
    full: bool,
    /// Requests waiting for the next wave, and whether they were aborted meanwhile.
    waiting: HashMap<RequestId, bool>,
}

impl WaveBackend {
    /// Static batches of up to `cap` requests in front of `inner`.
    pub fn new(inner: Arc<dyn Backend>, cap: usize) -> Self {
        WaveBackend {
            inner,
            cap: cap.max(1),
            state: Mutex::new(WaveState::default()),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WaveState> {
        // A panic while holding this lock leaves plain counters behind; keep going.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for a place in a wave; `false` when the request was aborted while waiting.
    async fn join_wave(&self, id: RequestId) -> bool {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if s.waiting.get(&id) == Some(&true) {
                    s.waiting.remove(&id);
                    return false;
                }
                if !s.full && s.members < self.cap {
                    s.waiting.remove(&id);
                    s.members += 1;
                    s.full = s.members == self.cap;
                    return true;
                }
                s.waiting.entry(id).or_insert(false);
            }
            notified.await;
        }
    }

    fn leave_wave(&self) {
        {
            let mut s = self.lock();
            s.members = s.members.saturating_sub(1);
            if s.members == 0 {
                s.full = false;
            }
        }
        self.changed.notify_waiters();
    }
}

/// Leaves the wave when dropped, so a cancelled `generate` cannot wedge it.
struct WaveGuard<'a>(&'a WaveBackend);

impl Drop for WaveGuard<'_> {
    fn drop(&mut self) {
        self.0.leave_wave();
    }
}

#[async_trait]
impl Backend for WaveBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn generate(&self, req: GenRequest) -> Result<GenOutput, BackendError> {
        if !self.join_wave(req.id).await {
            // Aborted before it started: the output so far is what it resumed from.
            let output = req.resume.clone().unwrap_or_default();
            return Ok(GenOutput {
                id: req.id,
                prompt_len: req.prompt.len(),
                output,
                finish_reason: FinishReason::Aborted,
                start_version: req.start_version,
                served_by: Vec::new(),
            });
        }
        let _guard = WaveGuard(self);
        self.inner.generate(req).await
    }

    async fn abort(&self, id: RequestId) -> Result<(), BackendError> {
        let waiting = {
            let mut s = self.lock();
            match s.waiting.get_mut(&id) {
                Some(a) => {
                    *a = true;
                    true
                }
                None => false,
            }
        };
        if waiting {
            self.changed.notify_waiters();
            return Ok(());
        }
        self.inner.abort(id).await
    }

    async fn pause(&self, mode: PauseMode) -> Result<(), BackendError> {
        if mode == PauseMode::Abort {
            // Everything in flight comes back aborted, the not-yet-started included.
            {
                let mut s = self.lock();
                for a in s.waiting.values_mut() {
                    *a = true;
                }
            }
            self.changed.notify_waiters();
        }
        self.inner.pause(mode).await
    }

    async fn resume(&self) -> Result<(), BackendError> {
        self.inner.resume().await
    }

    async fn update_weights(&self, update: &WeightUpdate) -> Result<(), BackendError> {
        self.inner.update_weights(update).await
    }

    async fn load(&self) -> Result<BackendLoad, BackendError> {
        self.inner.load().await
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.inner.health().await
    }
}

/// An environment whose trajectory holds one generation slot from `reset` until it ends
/// (the environment is dropped), waits on the environment included: environment-level
/// asynchrony turned off. The slots are the engines' `max_running_requests` in total, so
/// while some trajectories sleep in their environments, fewer generate.
pub struct SlotEnv {
    inner: Box<dyn Env>,
    slots: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

#[async_trait]
impl Env for SlotEnv {
    async fn reset(&mut self, seed: u64) -> Result<Reset, EnvError> {
        if self.permit.is_none() {
            let p = Arc::clone(&self.slots).acquire_owned().await.map_err(|e| {
                EnvError::Failed(format!("slot: {}", rollflash_core::error_chain(&e)))
            })?;
            self.permit = Some(p);
        }
        self.inner.reset(seed).await
    }

    async fn step(&mut self, action: &str) -> Result<Step, EnvError> {
        self.inner.step(action).await
    }
}
