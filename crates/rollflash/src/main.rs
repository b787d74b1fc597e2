//! The `rollflash` command line: the binary edge, where `anyhow` turns library errors into
//! messages for people.

mod cmd;
mod log_writer;
mod signal;

use cmd::{
    bench, bench_engine, bench_proxy, bench_sandbox, dashboard, env_serve, eval, generate, serve,
    sim, train, verify,
};

use std::path::PathBuf;

use anyhow::Result;

// Tensors are allocated and freed by the thousand per step; the system allocator returns large
// blocks to the OS and pays page faults to get them back, mimalloc keeps them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use clap::{Parser, Subcommand};

/// Asynchronous RL post-training for language models.
#[derive(Debug, Parser)]
#[command(name = "rollflash", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Post-train a policy with asynchronous RL.
    ///
    /// With no arguments: the built-in tiny model learns the built-in long-tailed arithmetic
    /// task on this CPU in minutes (a cached supervised warm-up, then GRPO-style RL with
    /// decoupled PPO, α = 1). `--config FILE` and `--set key=value` change anything;
    /// `--dry-run` prints the resolved config.
    Train(train::TrainArgs),
    /// Held-out greedy accuracy / success rate of a checkpoint on a config's task.
    Eval(eval::EvalArgs),
    /// Serve the run dashboard of a run directory (curves, timeline, trajectories) from its
    /// files, until Ctrl-C.
    Dashboard(dashboard::DashboardArgs),
    /// Rebuild a run's report (`DIR/report/`: plots and report.md) from its metrics.jsonl.
    Report {
        /// The run's output directory.
        dir: PathBuf,
    },
    /// Generate text with the built-in model or a Hugging Face model directory.
    Generate(generate::GenerateArgs),
    /// Convert a llama.cpp GGUF file (e.g. SmolLM2-135M-Instruct) into a Hugging Face directory.
    ConvertGguf {
        /// The `.gguf` file.
        input: PathBuf,
        /// Output directory (created).
        output: PathBuf,
    },
    /// Measure ROLL Flash's speed-ups: the synchronous baseline and each mechanism (queue
    /// scheduling, prompt replication, α, environment-level async, redundant environments)
    /// alone and combined, side by side on the same threads, model and sample count.
    Bench(bench::BenchRlArgs),
    /// Measure the engine: decode tokens/s at several batch sizes and training tokens/s.
    BenchEngine(bench_engine::BenchArgs),
    /// Measure the control plane: requests/s and added latency through the proxy to
    /// no-compute backends, at several concurrency levels.
    BenchProxy(bench_proxy::BenchProxyArgs),
    /// Measure the code sandbox: start-up overhead and executions/s at several pool sizes,
    /// beside the same programs run unsandboxed.
    BenchSandbox(bench_sandbox::BenchSandboxArgs),
    /// Serve a model over HTTP: the SGLang-native API and the OpenAI-compatible API.
    Serve(serve::ServeArgs),
    /// Simulate the scheduler at cluster scale (speed-up vs α, 8 → 512 GPUs, long tails,
    /// redundancy); `sim validate` checks the simulator against a measured run.
    Sim(sim::SimArgs),
    /// Serve a built-in environment over HTTP, so rollouts can use it from another process.
    EnvServe(env_serve::EnvServeArgs),
    /// Score a response with the math verifier, or a case set with human verdicts
    /// (`--cases scripts/verifier_cases.jsonl`): one JSON verdict per case, and the agreement.
    Verify(verify::VerifyArgs),
}

fn main() -> std::result::Result<(), ErrorReport> {
    // candle parallelises elementwise ops on its own spin-waiting pool, which on a few cores
    // fights the matmul threads and slows small ops 2-3x; our engines and trainer already get
    // their parallelism from explicit rayon pools. Must run before the first candle op.
    keep_freed_memory();
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    // candle 0.11 asks for its matmul thread count on every matmul, and unless
    // RAYON_NUM_THREADS is set it re-reads and parses /proc/cpuinfo each time (its probe caches
    // nothing when it finds no preferred CPUs): ~110 reads per training step of the default
    // model, a few percent of the step. rayon's own default is this same count, so no pool
    // changes size; our engines and trainer run in explicit pools of their own anyway.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::env::set_var("RAYON_NUM_THREADS", cpus.to_string());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(log_writer::AboveBars)
        // Colour codes only for a person at a terminal: a log redirected to a file (or read
        // by a test) stays plain text. NO_COLOR (no-color.org) turns them off there too.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
    let cli = Cli::parse();
    let result: Result<()> = match cli.command {
        Command::Train(a) => train::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Report { dir } => eval::report(dir),
        Command::Dashboard(a) => dashboard::run(a),
        Command::Generate(a) => generate::run(a),
        Command::ConvertGguf { input, output } => {
            rollflash_model::gguf::convert_gguf_to_hf(&input, &output)
                .map(|()| println!("wrote {}", output.display()))
                .map_err(Into::into)
        }
        Command::Bench(a) => bench::run(a),
        Command::BenchEngine(a) => bench_engine::run(a),
        Command::BenchProxy(a) => bench_proxy::run(a),
        Command::BenchSandbox(a) => bench_sandbox::run(a),
        Command::Serve(a) => serve::run(a),
        Command::EnvServe(a) => env_serve::run(a),
        Command::Sim(a) => sim::run(a),
        Command::Verify(a) => verify::run(a),
    };
    result.map_err(ErrorReport)
}

/// How a failed command is printed: the message and each of its causes on one line
/// (`cannot read config run.toml: No such file or directory (os error 2)`). Our errors name
/// their context and keep the cause as their source, so each cause is said once; the one
/// chain printer (`rollflash_core::error_chain`) also skips a cause a third-party error already
/// repeats in its own message.
struct ErrorReport(anyhow::Error);

impl std::fmt::Debug for ErrorReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e: &(dyn std::error::Error + 'static) = self.0.as_ref();
        write!(f, "{}", rollflash_core::error_chain(e))
    }
}

/// Tells mimalloc never to return freed pages to the OS: a training step frees and re-allocates
/// the same large activation buffers every time, and getting them back costs page faults and
/// kernel page zeroing (measured: ~15% of a training step).
#[allow(unsafe_code)]
fn keep_freed_memory() {
    /// `mi_option_purge_delay` in mimalloc 2.x's `mimalloc.h` (the -sys crate does not export
    /// the name).
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: sets a plain integer option of the allocator; no pointers involved, and mimalloc
    // documents options as settable at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// A rayon pool of `threads` threads: candle's kernels run on the pool they are called from, so
/// work `install`ed here uses exactly that many. Build it once; threads are not free.
pub(crate) fn thread_pool(threads: usize) -> Result<rayon::ThreadPool> {
    Ok(rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()?)
}
