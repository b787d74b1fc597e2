//! `rollflash bench-sandbox`: what the code sandbox costs — the start-up overhead of one
//! execution and executions per second at several pool sizes — beside the same programs run
//! by the bare interpreter with the same concurrency, side by side in one process.
//!
//! The bare side is the reference, not an alternative: it is what running the model's code
//! without containment would cost (a fresh `python3 -I -B` per program, as the sandbox runs).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rollflash_core::IoError;
use rollflash_sandbox::{Program, Sandbox, SandboxConfig, SandboxError, Verdict};
use tokio::sync::Semaphore;

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum SandboxBenchError {
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Io(#[from] IoError),
    /// The bare interpreter could not run a program, or a program did not pass where it
    /// should (the comparison would be of different work).
    #[error("{0}")]
    Bare(String),
    #[error("bad data row {row} of {path}: {reason}")]
    Data {
        path: String,
        row: usize,
        reason: String,
    },
}

/// A program the benchmark runs, Python source that exits 0.
#[derive(Debug, Clone)]
pub struct BenchProgram {
    pub name: String,
    pub source: String,
}

/// The default work: a function and its asserts, the shape of a HumanEval check (about
/// what one test of a code reward runs).
pub fn default_programs() -> Vec<BenchProgram> {
    vec![BenchProgram {
        name: "assert-check".into(),
        source: "def f(xs):\n    return sorted(set(xs))[:3]\n\n\
                 def check(candidate):\n    assert candidate([3, 1, 2, 3]) == [1, 2, 3]\n    \
                 assert candidate([]) == []\n    assert candidate(list(range(100, 0, -1))) == [1, 2, 3]\n\n\
                 check(f)\n"
            .into(),
    }]
}

/// HumanEval's canonical programs (prompt, canonical solution, tests, `check`), from the
/// JSONL `scripts/make_humaneval_data.sh` writes: the code reward's real work.
pub fn humaneval_programs(path: &Path) -> Result<Vec<BenchProgram>, SandboxBenchError> {
    let text = std::fs::read_to_string(path).map_err(IoError::at("cannot read", path))?;
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = |reason: String| SandboxBenchError::Data {
            path: path.display().to_string(),
            row: i + 1,
            reason,
        };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        let field = |k: &str| {
            v[k].as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(format!("no string field `{k}`")))
        };
        let (prompt, solution, test, entry) = (
            field("prompt")?,
            field("canonical_solution")?,
            field("test")?,
            field("entry_point")?,
        );
        out.push(BenchProgram {
            name: field("task_id")?,
            source: format!("{prompt}{solution}\n\n{test}\n\ncheck({entry})\n"),
        });
    }
    Ok(out)
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct SandboxBenchOptions {
    /// Pool sizes (`sandbox.workers`); the bare side runs as many at once.
    pub pools: Vec<usize>,
    /// Executions per pool size and side (the programs cycled through).
    pub executions: usize,
    pub programs: Vec<BenchProgram>,
    /// The sandbox's limits; `workers` is set per pool size.
    pub config: SandboxConfig,
    /// Executions of an empty program, one at a time, for the start-up overhead.
    pub startup_runs: usize,
}

/// One pool size, both sides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolResult {
    pub workers: usize,
    pub sandboxed_per_s: f64,
    pub bare_per_s: f64,
    /// Mean wall time of one execution, milliseconds.
    pub sandboxed_mean_ms: f64,
    pub bare_mean_ms: f64,
}

/// The benchmark's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxBenchReport {
    /// Mean wall time of an empty program, one at a time, milliseconds.
    pub startup_sandboxed_ms: f64,
    pub startup_bare_ms: f64,
    pub pools: Vec<PoolResult>,
    pub programs: usize,
    pub executions: usize,
}

impl SandboxBenchReport {
    /// The tables, Markdown.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "start-up (an empty program, one at a time): sandboxed {:.1} ms, bare {:.1} ms, \
             overhead {:.1} ms ({:.2}x)\n\n",
            self.startup_sandboxed_ms,
            self.startup_bare_ms,
            self.startup_sandboxed_ms - self.startup_bare_ms,
            self.startup_sandboxed_ms / self.startup_bare_ms.max(1e-9)
        );
        s.push_str(&format!(
            "{} executions per pool size and side, {} distinct programs\n\n",
            self.executions, self.programs
        ));
        s.push_str("| workers | sandboxed exec/s | bare exec/s | sandboxed / bare | sandboxed mean ms | bare mean ms |\n");
        s.push_str("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for p in &self.pools {
            s.push_str(&format!(
                "| {} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} |\n",
                p.workers,
                p.sandboxed_per_s,
                p.bare_per_s,
                p.sandboxed_per_s / p.bare_per_s.max(1e-9),
                p.sandboxed_mean_ms,
                p.bare_mean_ms
            ));
        }
        s
    }
}

/// Runs `program` with the bare interpreter (`python3 -I -B FILE`, the sandbox's command
/// line), within the sandbox's wall limit; an error unless it exits 0.
async fn run_bare(
    python: &Path,
    file: &Path,
    wall: Duration,
) -> Result<Duration, SandboxBenchError> {
    let started = Instant::now();
    let child = tokio::process::Command::new(python)
        .args(["-I", "-B"])
        .arg(file)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| SandboxBenchError::Bare(format!("cannot start {}: {e}", python.display())))?;
    let out = tokio::time::timeout(wall, child.wait_with_output())
        .await
        .map_err(|_| SandboxBenchError::Bare(format!("{} timed out", file.display())))?
        .map_err(|e| SandboxBenchError::Bare(format!("{}: {e}", file.display())))?;
    let took = started.elapsed();
    if !out.status.success() {
        return Err(SandboxBenchError::Bare(format!(
            "a program failed unsandboxed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(took)
}

/// `executions` runs of `programs` (cycled), at most `workers` at once, sandboxed or bare:
/// (executions/s, mean wall per execution).
async fn measure(
    sandbox: Option<&Sandbox>,
    python: &Path,
    dir: &Path,
    programs: &[BenchProgram],
    executions: usize,
    workers: usize,
    wall: Duration,
) -> Result<(f64, f64), SandboxBenchError> {
    // The bare side's files, written before the clock starts (the sandbox writes its own
    // per execution, which is part of what it costs).
    let mut files = Vec::new();
    if sandbox.is_none() {
        for (j, p) in programs.iter().enumerate() {
            let file = dir.join(format!("p{j}.py"));
            std::fs::write(&file, &p.source).map_err(IoError::at("cannot write", &file))?;
            files.push(file);
        }
    }
    let files = &files;
    let gate = Arc::new(Semaphore::new(workers.max(1)));
    let started = Instant::now();
    let runs = (0..executions).map(|i| {
        let gate = Arc::clone(&gate);
        let j = i % programs.len();
        let p = &programs[j];
        async move {
            // The sandbox bounds itself by its pool; the gate does the same for the bare side.
            let _permit = gate.acquire().await.ok();
            match sandbox {
                Some(sb) => {
                    let e = sb.run(&Program::python(p.source.clone())).await?;
                    if e.verdict != Verdict::Passed {
                        return Err(SandboxBenchError::Bare(format!(
                            "{} did not pass in the sandbox: {} {}",
                            p.name, e.verdict, e.stderr
                        )));
                    }
                    Ok(e.wall)
                }
                None => run_bare(python, &files[j], wall).await,
            }
        }
    });
    let walls = futures::future::try_join_all(runs).await?;
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    let mean_ms =
        walls.iter().map(Duration::as_secs_f64).sum::<f64>() * 1e3 / walls.len().max(1) as f64;
    Ok((executions as f64 / elapsed, mean_ms))
}

/// Runs the benchmark: start-up first, then each pool size, sandboxed and bare alternating
/// which goes first so drift in the machine's load weighs on both.
pub async fn run(opts: &SandboxBenchOptions) -> Result<SandboxBenchReport, SandboxBenchError> {
    let scratch = tempfile::tempdir().map_err(IoError::at("cannot create", "a temporary dir"))?;
    let python = opts.config.python.clone();
    let wall = Duration::from_secs_f64(opts.config.wall_secs);
    let empty = [BenchProgram {
        name: "empty".into(),
        source: "pass\n".into(),
    }];
    let one = Sandbox::new(SandboxConfig {
        workers: 1,
        ..opts.config.clone()
    })
    .await?;
    let n = opts.startup_runs.max(1);
    let (_, startup_sandboxed_ms) =
        measure(Some(&one), &python, scratch.path(), &empty, n, 1, wall).await?;
    let (_, startup_bare_ms) = measure(None, &python, scratch.path(), &empty, n, 1, wall).await?;
    let mut pools = Vec::new();
    for (k, &workers) in opts.pools.iter().enumerate() {
        let sb = Sandbox::new(SandboxConfig {
            workers,
            ..opts.config.clone()
        })
        .await?;
        let args = (
            &python,
            scratch.path(),
            &opts.programs[..],
            opts.executions,
            workers,
            wall,
        );
        let sandboxed = |sb| measure(Some(sb), args.0, args.1, args.2, args.3, args.4, args.5);
        let bare = || measure(None, args.0, args.1, args.2, args.3, args.4, args.5);
        let (s, b) = if k % 2 == 0 {
            let s = sandboxed(&sb).await?;
            (s, bare().await?)
        } else {
            let b = bare().await?;
            (sandboxed(&sb).await?, b)
        };
        pools.push(PoolResult {
            workers,
            sandboxed_per_s: s.0,
            bare_per_s: b.0,
            sandboxed_mean_ms: s.1,
            bare_mean_ms: b.1,
        });
    }
    Ok(SandboxBenchReport {
        startup_sandboxed_ms,
        startup_bare_ms,
        pools,
        programs: opts.programs.len(),
        executions: opts.executions,
    })
}
