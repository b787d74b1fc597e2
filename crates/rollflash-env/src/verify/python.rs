//! Python reward functions — verl's `compute_score` and TRL's `reward_funcs`, as users wrote them — run in a pool of long-lived Python worker processes.
//!
//! **Why processes.** The user's function runs in the interpreter (and venv) they name, with
//! whatever it imports; a function that hangs, leaks or kills its interpreter takes one
//! worker with it, never the run, and the worker is started again.
//!
//! **Protocol.** Each worker is `python -u -c <reward_worker.py>` (the script is embedded),
//! fed over its stdin and stdout with frames of a u32 big-endian length and that many bytes
//! of JSON (the script's header has the messages). Every wait on a worker has a deadline:
//! the start (`start_timeout_secs`), each call (`timeout_secs`), the whole wait of a sample
//! including queueing (`queue_timeout_secs`). The pipes are tokio's: nothing here blocks the
//! async runtime.
//!
//! **Batching.** A dispatcher task hands each free worker the oldest waiting sample. A verl
//! sample is one call; a TRL sample goes with every other TRL sample of the same function
//! waiting at that moment (up to `max_batch`), in one call
//! `f(prompts=[…], completions=[…], **columns)` — TRL's calling convention, on whatever
//! finished together (a group's completions, usually), never waiting to fill a batch.
//!
//! **Failures** cost the samples of that call a [`Scored`] error with the reason (the
//! traceback, "returned str 'x'", "timed out after 5 s", "worker exited: …"), which the
//! dataset task turns into its counted `reward_failed` verdict.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// The worker script, run with `python -u -c`.
const WORKER_SCRIPT: &str = include_str!("reward_worker.py");

/// Largest reply frame accepted: a worker writing more is broken, not slow.
const MAX_FRAME_BYTES: u32 = 64 << 20;

/// Lines of a worker's stderr kept for the message when it dies.
const STDERR_TAIL_LINES: usize = 20;

/// Settings of the worker pool (`[reward.python]` in a run's config). Defaults and
/// validation live here, once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PythonPoolConfig {
    /// The interpreter: a venv's `bin/python` gives the functions that venv's packages.
    /// A bare name is looked up on `PATH`.
    pub python: PathBuf,
    /// Worker processes; each runs one call at a time.
    pub workers: usize,
    /// Deadline of one call, in seconds: past it the worker is killed and started again, and
    /// the call's samples fail.
    pub timeout_secs: f64,
    /// Deadline of a worker's start (the interpreter and the script, not the user's module,
    /// which is imported by the first call), in seconds.
    pub start_timeout_secs: f64,
    /// Longest a sample may wait for its score in all (queueing included), in seconds; a
    /// bound on a pool wedged by a bug, since every call already has its deadline.
    pub queue_timeout_secs: f64,
    /// Most TRL samples in one call.
    pub max_batch: usize,
}

impl Default for PythonPoolConfig {
    fn default() -> PythonPoolConfig {
        PythonPoolConfig {
            python: PathBuf::from("python3"),
            workers: 2,
            timeout_secs: 30.0,
            start_timeout_secs: 60.0,
            queue_timeout_secs: 600.0,
            max_batch: 64,
        }
    }
}

/// A pool setting out of range, named by its field (under `reward.python`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PythonConfigError {
    /// The field, as the config file spells it.
    pub field: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

fn bad(field: &'static str, reason: impl Into<String>) -> PythonConfigError {
    PythonConfigError {
        field,
        reason: reason.into(),
    }
}

fn check_secs(field: &'static str, v: f64) -> Result<(), PythonConfigError> {
    // One day: far past any reward, and keeps `Duration` arithmetic finite.
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(bad(
            field,
            format!("must be in (0, 86400] seconds, got {v}"),
        ));
    }
    Ok(())
}

impl PythonPoolConfig {
    /// Checks every value; the error names the field.
    pub fn validate(&self) -> Result<(), PythonConfigError> {
        if self.python.as_os_str().is_empty() {
            return Err(bad("python", "must name an interpreter"));
        }
        if self.workers == 0 || self.workers > 1024 {
            return Err(bad(
                "workers",
                format!("must be in 1..=1024, got {}", self.workers),
            ));
        }
        check_secs("timeout_secs", self.timeout_secs)?;
        check_secs("start_timeout_secs", self.start_timeout_secs)?;
        check_secs("queue_timeout_secs", self.queue_timeout_secs)?;
        if self.max_batch == 0 {
            return Err(bad("max_batch", "must be at least 1"));
        }
        Ok(())
    }
}

/// How a function is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardStyle {
    /// verl: `compute_score(data_source, solution_str, ground_truth, extra_info)` per sample,
    /// returning a float or a dict with `score` (its other numeric keys become metrics).
    #[default]
    Verl,
    /// TRL: `f(prompts, completions, **columns) -> list[float]`, batched.
    Trl,
}

impl RewardStyle {
    fn name(self) -> &'static str {
        match self {
            RewardStyle::Verl => "verl",
            RewardStyle::Trl => "trl",
        }
    }
}

fn default_function() -> String {
    "compute_score".into()
}

/// One function in one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonFunction {
    /// The Python file (relative paths are relative to the working directory).
    pub path: PathBuf,
    /// The function's name in it.
    #[serde(default = "default_function")]
    pub function: String,
}

/// A dataset task's Python reward (`reward = { python = { … } }`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonReward {
    /// The Python file.
    pub path: PathBuf,
    /// The function's name in it.
    #[serde(default = "default_function")]
    pub function: String,
    /// `verl` (the default) or `trl`.
    #[serde(default)]
    pub style: RewardStyle,
    /// Per-`data_source` functions (verl's one scorer per source): a row whose data source
    /// is a key here is scored by that function, every other row by `path`/`function` (which
    /// receives the data source too, as verl's `default_compute_score` does).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_source: BTreeMap<String, PythonFunction>,
}

impl PythonReward {
    /// The function that scores a row of `data_source`.
    pub fn function_for(&self, data_source: Option<&str>) -> (&Path, &str) {
        match data_source.and_then(|s| self.by_source.get(s)) {
            Some(f) => (&f.path, &f.function),
            None => (&self.path, &self.function),
        }
    }

    /// Checks that every file is there; the error names the field and the path.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let files = std::iter::once(("reward.python.path".to_string(), &self.path)).chain(
            self.by_source
                .iter()
                .map(|(s, f)| (format!("reward.python.by_source.{s}.path"), &f.path)),
        );
        for (field, path) in files {
            if !path.is_file() {
                return Err((field, format!("{} is not a file", path.display())));
            }
        }
        Ok(())
    }
}

/// A successful score.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    /// The reward (finite).
    pub value: f64,
    /// verl's extra numeric keys, in the function's order.
    pub extra: Vec<(String, f64)>,
}

/// A sample's outcome: its score, or why the function failed it.
pub type Scored = Result<Score, String>;

/// One sample to score.
#[derive(Debug, Clone)]
pub struct Call {
    /// The Python file.
    pub path: PathBuf,
    /// The function in it.
    pub function: String,
    pub style: RewardStyle,
    /// The sample's arguments: for verl `{data_source, solution_str, ground_truth,
    /// extra_info}`; for TRL `{prompt, completion, columns}` (the worker makes the lists).
    pub args: Value,
}

/// The pool could not start.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    /// A setting out of range, named as the config file spells it.
    #[error("invalid reward.python.{field}: {reason}")]
    Config { field: &'static str, reason: String },
    /// The first worker did not start: the interpreter is missing or broken.
    #[error("cannot start the Python reward worker with {python}: {reason}")]
    Start { python: PathBuf, reason: String },
}

impl From<PythonConfigError> for PythonError {
    fn from(e: PythonConfigError) -> Self {
        PythonError::Config {
            field: e.field,
            reason: e.reason,
        }
    }
}

/// Counters of a pool, for logs and benchmarks.
#[derive(Debug, Default)]
pub struct PoolStats {
    /// Samples scored (a score or a failure).
    pub samples: AtomicU64,
    /// Calls made to workers.
    pub calls: AtomicU64,
    /// Samples the function failed.
    pub failed: AtomicU64,
    /// Workers started again after a hang, a death or a broken reply.
    pub restarts: AtomicU64,
}

/// A sample waiting for a worker.
struct Job {
    call: Call,
    reply: oneshot::Sender<Scored>,
}

/// The pool: clones share the workers. Dropping the last clone stops the dispatcher, whose
/// end stops every worker task, whose process is killed on drop.
#[derive(Clone)]
pub struct PythonPool {
    jobs: mpsc::UnboundedSender<Job>,
    inner: Arc<Inner>,
}

struct Inner {
    cfg: PythonPoolConfig,
    stats: Arc<PoolStats>,
    /// The dispatcher and the worker tasks: aborted when the pool goes.
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl std::fmt::Debug for PythonPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonPool")
            .field("python", &self.inner.cfg.python)
            .field("workers", &self.inner.cfg.workers)
            .finish()
    }
}

impl PythonPool {
    /// Starts `cfg.workers` workers; fails when the first cannot start (so a missing
    /// interpreter stops the run before any model is loaded, with the reason).
    pub async fn start(cfg: PythonPoolConfig) -> Result<PythonPool, PythonError> {
        cfg.validate()?;
        let stats = Arc::new(PoolStats::default());
        let mut processes = Vec::with_capacity(cfg.workers);
        for _ in 0..cfg.workers {
            let p = Process::spawn(&cfg)
                .await
                .map_err(|reason| PythonError::Start {
                    python: cfg.python.clone(),
                    reason,
                })?;
            processes.push(p);
        }
        let (jobs, jobs_rx) = mpsc::unbounded_channel();
        let (idle_tx, idle_rx) = mpsc::unbounded_channel();
        let mut tasks = Vec::with_capacity(cfg.workers + 1);
        let mut batches = Vec::with_capacity(cfg.workers);
        for (id, p) in processes.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel(1);
            batches.push(tx);
            let worker = Worker {
                id,
                cfg: cfg.clone(),
                process: Some(p),
                stats: Arc::clone(&stats),
            };
            tasks.push(tokio::spawn(worker.serve(rx, idle_tx.clone())));
        }
        drop(idle_tx);
        tasks.push(tokio::spawn(dispatch(
            jobs_rx,
            idle_rx,
            batches,
            cfg.max_batch,
        )));
        Ok(PythonPool {
            jobs,
            inner: Arc::new(Inner { cfg, stats, tasks }),
        })
    }

    /// Scores one sample. Never fails the caller: a failure is the sample's [`Scored`] error.
    pub async fn score(&self, call: Call) -> Scored {
        let (reply, rx) = oneshot::channel();
        if self.jobs.send(Job { call, reply }).is_err() {
            return Err("the Python reward pool has stopped".into());
        }
        let c = &self.inner.cfg;
        let wait = Duration::from_secs_f64(c.queue_timeout_secs + c.timeout_secs);
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(scored)) => scored,
            Ok(Err(_)) => Err("the Python reward worker stopped before answering".into()),
            Err(_) => Err(format!(
                "no Python reward worker answered within {:.0} s",
                wait.as_secs_f64()
            )),
        }
    }

    /// The pool's counters.
    pub fn stats(&self) -> &PoolStats {
        &self.inner.stats
    }
}

/// Hands waiting samples to free workers (see the module docs), until the pool is dropped.
async fn dispatch(
    mut jobs: mpsc::UnboundedReceiver<Job>,
    mut idle: mpsc::UnboundedReceiver<usize>,
    workers: Vec<mpsc::Sender<Vec<Job>>>,
    max_batch: usize,
) {
    let mut pending: VecDeque<Job> = VecDeque::new();
    let mut free: Vec<usize> = (0..workers.len()).collect();
    loop {
        tokio::select! {
            job = jobs.recv() => match job {
                Some(j) => pending.push_back(j),
                // Every pool handle is gone: waiting samples' replies drop with `pending`.
                None => return,
            },
            w = idle.recv() => match w {
                Some(w) => free.push(w),
                // Every worker task ended (only by a bug): fail what waits, and what comes.
                None => {
                    pending.clear();
                    while let Some(j) = jobs.recv().await {
                        let _ = j.reply.send(Err("no Python reward worker is running".into()));
                    }
                    return;
                }
            },
        }
        // Everything already sent joins the queue before any batch is formed: samples that
        // finished together go together.
        while let Ok(j) = jobs.try_recv() {
            pending.push_back(j);
        }
        while !pending.is_empty() {
            let Some(w) = free.pop() else { break };
            let batch = take_batch(&mut pending, max_batch);
            if let Err(mpsc::error::SendError(batch)) = workers[w].send(batch).await {
                for j in batch {
                    let _ = j
                        .reply
                        .send(Err("a Python reward worker task ended".into()));
                }
            }
        }
    }
}

/// The oldest waiting sample, with (for TRL) every waiting sample of the same function.
fn take_batch(pending: &mut VecDeque<Job>, max_batch: usize) -> Vec<Job> {
    let Some(first) = pending.pop_front() else {
        return Vec::new();
    };
    if first.call.style != RewardStyle::Trl {
        return vec![first];
    }
    let mut batch = vec![first];
    let mut rest = VecDeque::with_capacity(pending.len());
    while let Some(j) = pending.pop_front() {
        let same = j.call.style == RewardStyle::Trl
            && j.call.path == batch[0].call.path
            && j.call.function == batch[0].call.function;
        if same && batch.len() < max_batch {
            batch.push(j);
        } else {
            rest.push_back(j);
        }
    }
    *pending = rest;
    batch
}

/// One worker slot: its process (started again after a failure), calls one at a time.
struct Worker {
    id: usize,
    cfg: PythonPoolConfig,
    process: Option<Process>,
    stats: Arc<PoolStats>,
}

impl Worker {
    async fn serve(
        mut self,
        mut batches: mpsc::Receiver<Vec<Job>>,
        idle: mpsc::UnboundedSender<usize>,
    ) {
        while let Some(batch) = batches.recv().await {
            let (calls, replies): (Vec<Call>, Vec<_>) =
                batch.into_iter().map(|j| (j.call, j.reply)).unzip();
            let results = self.call(&calls).await;
            let n = replies.len() as u64;
            self.stats.samples.fetch_add(n, Ordering::Relaxed);
            self.stats.calls.fetch_add(1, Ordering::Relaxed);
            let failed = results.iter().filter(|r| r.is_err()).count() as u64;
            self.stats.failed.fetch_add(failed, Ordering::Relaxed);
            for (reply, r) in replies.into_iter().zip(results) {
                // The sample's waiter may have given up (its own deadline): nothing to tell.
                let _ = reply.send(r);
            }
            if idle.send(self.id).is_err() {
                return;
            }
        }
    }

    /// One call for `calls` (one function, one style); a result per sample.
    async fn call(&mut self, calls: &[Call]) -> Vec<Scored> {
        let Some(first) = calls.first() else {
            return Vec::new();
        };
        let all = |e: String| calls.iter().map(|_| Err(e.clone())).collect::<Vec<_>>();
        if self.process.is_none() {
            self.stats.restarts.fetch_add(1, Ordering::Relaxed);
            match Process::spawn(&self.cfg).await {
                Ok(p) => self.process = Some(p),
                Err(e) => return all(format!("cannot restart the Python reward worker: {e}")),
            }
        }
        let Some(process) = self.process.as_mut() else {
            return all("no Python reward worker".into());
        };
        let request = json!({
            "path": first.path,
            "function": first.function,
            "style": first.style.name(),
            "items": calls.iter().map(|c| &c.args).collect::<Vec<_>>(),
        });
        let deadline = Duration::from_secs_f64(self.cfg.timeout_secs);
        let reply = match tokio::time::timeout(deadline, process.call(&request)).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => {
                // Dead or broken: the next call starts a fresh process.
                let why = match self.process.take() {
                    Some(p) => p.death(e).await,
                    None => e,
                };
                tracing::warn!(function = %first.function, "Python reward worker: {why}");
                return all(why);
            }
            Err(_) => {
                self.process = None;
                let why = format!(
                    "{}:{} timed out after {} s (worker restarted)",
                    first.path.display(),
                    first.function,
                    self.cfg.timeout_secs
                );
                tracing::warn!("Python reward: {why}");
                return all(why);
            }
        };
        let results = parse_reply(&reply, calls.len());
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            tracing::warn!(function = %first.function, "Python reward failed: {e}");
        }
        results
    }
}

/// A worker's reply as one result per sample; anything malformed fails every sample.
fn parse_reply(reply: &Value, n: usize) -> Vec<Scored> {
    let all = |e: String| (0..n).map(|_| Err(e.clone())).collect::<Vec<_>>();
    if let Some(e) = reply.get("error") {
        return all(e
            .as_str()
            .unwrap_or("the function failed")
            .trim_end()
            .to_string());
    }
    let Some(results) = reply.get("results").and_then(Value::as_array) else {
        return all("the worker's reply has no results".into());
    };
    if results.len() != n {
        return all(format!(
            "the worker returned {} results for {n} samples",
            results.len()
        ));
    }
    results.iter().map(parse_result).collect()
}

fn parse_result(r: &Value) -> Scored {
    if let Some(e) = r.get("error") {
        return Err(e
            .as_str()
            .unwrap_or("the function failed")
            .trim_end()
            .to_string());
    }
    // The worker checks this too; a reward that is not finite must never reach the learner.
    let value = r
        .get("score")
        .and_then(Value::as_f64)
        .filter(|v| v.is_finite())
        .ok_or_else(|| format!("the worker's result has no finite score: {r}"))?;
    let extra = r
        .get("extra")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_f64().filter(|x| x.is_finite()).map(|x| (k.clone(), x)))
                .collect()
        })
        .unwrap_or_default();
    Ok(Score { value, extra })
}

/// A running worker process and its pipes; killed when dropped.
struct Process {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The last lines of its stderr (the rest is logged), for the message when it dies.
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// Reads stderr into the log and the tail; aborted with the process.
    stderr_task: JoinHandle<()>,
    /// Its process group (its own pid: it leads the group).
    pgid: Option<i32>,
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stderr_task.abort();
        self.kill_group();
    }
}

impl Process {
    /// Starts a worker and waits (up to `start_timeout_secs`) for its ready frame.
    async fn spawn(cfg: &PythonPoolConfig) -> Result<Process, String> {
        let mut child = Command::new(&cfg.python)
            .arg("-u")
            .arg("-c")
            .arg(WORKER_SCRIPT)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: what the function starts (a subprocess, a
            // multiprocessing pool) is killed with the worker, not orphaned.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", cfg.python.display()))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("the worker's pipes were not set up".into());
        };
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail = Arc::clone(&stderr_tail);
        let stderr_task = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(target: "rollflash::reward_python", "{line}");
                if let Ok(mut t) = tail.lock() {
                    if t.len() == STDERR_TAIL_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            }
        });
        let pgid = child.id().and_then(|id| i32::try_from(id).ok());
        let mut p = Process {
            pgid,
            child,
            stdin,
            stdout: BufReader::new(stdout),
            stderr_tail,
            stderr_task,
        };
        let wait = Duration::from_secs_f64(cfg.start_timeout_secs);
        match tokio::time::timeout(wait, p.read_frame()).await {
            Ok(Ok(v)) if v.get("ready") == Some(&Value::Bool(true)) => Ok(p),
            Ok(Ok(v)) => Err(format!("unexpected first message {v}")),
            Ok(Err(e)) => Err(p.death(e).await),
            Err(_) => Err(format!("not ready within {} s", cfg.start_timeout_secs)),
        }
    }

    async fn call(&mut self, request: &Value) -> Result<Value, String> {
        let body = serde_json::to_vec(request).map_err(|e| format!("request: {e}"))?;
        let len = u32::try_from(body.len()).map_err(|_| "request too large".to_string())?;
        let write = async {
            self.stdin.write_all(&len.to_be_bytes()).await?;
            self.stdin.write_all(&body).await?;
            self.stdin.flush().await
        };
        write
            .await
            .map_err(|e| format!("writing to the worker: {e}"))?;
        self.read_frame().await
    }

    async fn read_frame(&mut self) -> Result<Value, String> {
        let len = self
            .stdout
            .read_u32()
            .await
            .map_err(|e| format!("reading from the worker: {e}"))?;
        if len > MAX_FRAME_BYTES {
            return Err(format!("the worker sent a {len}-byte frame"));
        }
        let mut body = vec![0; len as usize];
        self.stdout
            .read_exact(&mut body)
            .await
            .map_err(|e| format!("reading from the worker: {e}"))?;
        serde_json::from_slice(&body).map_err(|e| format!("the worker sent bad JSON: {e}"))
    }

    /// Kills every process of the worker's group: the worker, and whatever the user's
    /// function started and left behind. The group outlives a worker that exited while
    /// any of its children live, so this also reaches the orphans of a worker that died.
    fn kill_group(&self) {
        if let Some(pid) = self.pgid.and_then(rustix::process::Pid::from_raw) {
            // Nothing left in the group (ESRCH) is the usual, fine outcome.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }

    /// Why a worker that failed `e` is gone: its exit status and last stderr lines.
    async fn death(mut self, e: String) -> String {
        // A closed pipe usually means the process is exiting; give it a moment to be reaped.
        let status = match tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await {
            Ok(Ok(s)) => format!("worker exited ({s})"),
            _ => format!("worker broke ({e})"),
        };
        self.kill_group();
        // Let the stderr reader take the last lines the process wrote.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let tail = self
            .stderr_tail
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default();
        if tail.is_empty() {
            format!("{status}; worker restarted")
        } else {
            format!("{status}; worker restarted; its stderr:\n{tail}")
        }
    }
}
