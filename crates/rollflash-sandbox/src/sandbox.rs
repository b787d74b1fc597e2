//! The sandbox itself: the bounded pool and the choice of backend (local bubblewrap, or a
//! remote SandboxFusion server in [`crate::fusion`]), the bubblewrap command line, one local
//! execution's deadline, output cap and kill, and the verdict both backends share.
//!
//! **Containment.** The payload runs as an unprivileged user inside fresh user, PID, network,
//! IPC, UTS, mount and cgroup namespaces. When this process is root (as in CI containers),
//! `bwrap` itself is started as `nobody` (65534): as root, the in-sandbox user would map to
//! host root, which the kernel exempts from `RLIMIT_NPROC`, and a fork bomb would not be held.
//! Started unprivileged, the process limit counts in the sandbox's own user namespace, so
//! concurrent executions do not share it. Everything the program starts lives in the PID
//! namespace, whose init (`bwrap`'s) is killed when the `bwrap` process we spawn dies
//! (`--die-with-parent`), and the kernel then kills every process left in it: killing that one
//! process ends the whole tree, even children that `setsid` or daemonise. (Killing a process
//! group would not reach them: `--new-session` puts the payload in a session of its own.)

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::Semaphore;

use crate::config::{ConfigError, Limits, SandboxConfig, SandboxKind};
use crate::fusion::Remote;
use crate::program::{normalise_output, Language, Program};
use crate::verdict::{Execution, Verdict};

/// `prlimit` (util-linux) sets the limits inside the sandbox, just before the interpreter:
/// it needs no code of ours between fork and exec, and applies to the payload only.
const PRLIMIT: &str = "/usr/bin/prlimit";

/// The unprivileged user (`nobody`) `bwrap` runs as when this process is root.
const NOBODY: u32 = 65_534;

/// How long a killed sandbox may take to be reaped before that is an error of its own.
const KILL_GRACE: Duration = Duration::from_secs(10);

/// Largest program source accepted; a response longer than this is not a program.
const MAX_SOURCE_BYTES: usize = 4 << 20;

/// Host paths the interpreter may need besides `/usr`: on merged-`/usr` systems these are
/// symbolic links into it, elsewhere directories bound read-only.
const SYSTEM_LINKS: [&str; 6] = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// Why an execution (or the sandbox) failed — as opposed to the program failing, which is a
/// [`Verdict`].
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A setting is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The sandbox cannot run programs here; nothing is run unsandboxed instead.
    #[error(
        "the code sandbox cannot start: {reason} (scripts/setup_sandbox.sh installs bubblewrap)"
    )]
    Unavailable {
        /// What failed: a missing binary, or what bubblewrap said.
        reason: String,
        /// The underlying error, when there was one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// bubblewrap started but could not set the sandbox up for this execution.
    #[error("bubblewrap could not set up the sandbox: {message}")]
    Setup {
        /// bubblewrap's (or prlimit's) message.
        message: String,
    },
    /// The program's file could not be written on the host.
    #[error("could not write the program under {}", path.display())]
    Scratch {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The program is larger than any program we run.
    #[error("the program is {bytes} bytes, more than the {MAX_SOURCE_BYTES} accepted")]
    TooLarge {
        /// Its size.
        bytes: usize,
    },
    /// `bwrap` could not be spawned.
    #[error("could not start {}", bwrap.display())]
    Spawn {
        /// The binary.
        bwrap: PathBuf,
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// Reading the program's output or waiting for it failed.
    #[error("talking to the sandboxed process failed")]
    Io(#[source] std::io::Error),
    /// A killed sandbox was not reaped in time.
    #[error("the sandbox process was not reaped within {0:?} of being killed")]
    Unreaped(Duration),
    /// No worker became free in time.
    #[error("no sandbox worker became free within {0:?}")]
    QueueTimeout(Duration),
    /// The remote sandbox failed its start-up check (a trivial program): the run does not
    /// start, and nothing runs locally or unsandboxed instead.
    #[error("the remote sandbox (SandboxFusion at {url}) cannot run programs: {source}")]
    RemoteUnavailable {
        /// The server's base URL.
        url: String,
        /// Why the trivial program failed.
        #[source]
        source: Box<SandboxError>,
    },
    /// The remote sandbox could not be reached, or answered with an HTTP error; `attempts`
    /// counts the tries (more than one where the failure was transient).
    #[error("the SandboxFusion server at {url} failed after {attempts} attempt(s): {reason}")]
    Remote {
        /// The server's base URL.
        url: String,
        /// What failed: the connection, or the HTTP status and body.
        reason: String,
        /// Requests sent.
        attempts: u32,
        /// The HTTP client's error, when there was one.
        #[source]
        source: Option<reqwest::Error>,
    },
    /// The server refused the request (HTTP 401 or 403): its key is missing or wrong. Not
    /// retried: the next request would carry the same key.
    #[error(
        "the SandboxFusion server at {url} refused the request (HTTP {status}; check \
         sandbox.api_key_env): {body}"
    )]
    RemoteRefused {
        /// The server's base URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the answer's body.
        body: String,
    },
    /// The server answered `status: SandboxError`: it failed itself, not the program.
    #[error(
        "the SandboxFusion server at {url} reported its own failure after {attempts} \
         attempt(s): {message}"
    )]
    RemoteSandboxError {
        /// The server's base URL.
        url: String,
        /// The server's `message`.
        message: String,
        /// Requests sent.
        attempts: u32,
    },
    /// No answer within the request's deadline (`wall_secs + remote_margin_secs`).
    #[error("the SandboxFusion server at {url} did not answer within {deadline:?}")]
    RemoteTimeout {
        /// The server's base URL.
        url: String,
        /// The deadline that passed.
        deadline: Duration,
    },
    /// A successful HTTP answer that is not a `run_code` answer.
    #[error("the SandboxFusion server at {url} answered with something else: {reason}")]
    RemoteGarbage {
        /// The server's base URL.
        url: String,
        /// What was wrong with it.
        reason: String,
        /// The JSON error, when decoding failed.
        #[source]
        source: Option<serde_json::Error>,
    },
    /// The program needs something `run_code` cannot carry.
    #[error("the SandboxFusion server at {url} cannot run a program with {what}")]
    RemoteUnsupported {
        /// The server's base URL.
        url: String,
        /// What it cannot carry.
        what: String,
    },
    /// The HTTP client could not be built.
    #[error("could not build an HTTP client for the SandboxFusion server at {url}")]
    RemoteClient {
        /// The server's base URL.
        url: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },
}

/// Runs programs, at most `workers` at once. Cheap to clone: clones share the pool.
#[derive(Debug, Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: SandboxConfig,
    limits: Limits,
    /// Bounds executions at once, local processes or remote requests alike.
    permits: Semaphore,
    backend: Backend,
}

/// Where executions run: private, so that callers (the code reward) see one `Sandbox`
/// whichever `kind` the config names.
#[derive(Debug)]
enum Backend {
    Local(Local),
    SandboxFusion(Remote),
}

/// What the local sandbox resolved about this host, once.
#[derive(Debug)]
struct Local {
    /// The user `bwrap` runs as, when it must be changed (this process is root).
    run_as: Option<u32>,
    scratch: PathBuf,
    /// The `/bin`, `/lib*` arguments for this host, resolved once.
    system: Vec<OsString>,
}

/// Why reading a program's output stopped early.
enum Stop {
    Overflow,
    Io(std::io::Error),
}

/// How an execution ended, before classification.
enum Ended {
    Exited(i32),
    Killed(Verdict),
}

/// The per-execution host directory holding the program file; removed on drop.
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // A few small files: removing them inline is cheaper than a blocking-pool hop.
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(path = %self.0.display(), error = %e, "could not remove a sandbox scratch directory");
        }
    }
}

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// The start-up check's program and what it prints.
const PROBE_OUTPUT: &str = "rollflash-sandbox-ok";

impl Sandbox {
    /// A sandbox for `config`, checked by running a trivial program in it: an error says why
    /// it cannot run programs (locally: no `bwrap`, no user namespaces, no interpreter;
    /// remotely: the server is down, refuses the key or answers wrong, naming its URL).
    pub async fn new(config: SandboxConfig) -> Result<Sandbox, SandboxError> {
        config.validate()?;
        match config.kind {
            SandboxKind::Local => Sandbox::new_local(config).await,
            SandboxKind::SandboxFusion => Sandbox::new_remote(config).await,
        }
    }

    /// The remote sandbox, once a trivial program ran on it (with the usual deadline and
    /// retries, so a server that is down fails within the retries' backoff).
    async fn new_remote(config: SandboxConfig) -> Result<Sandbox, SandboxError> {
        let remote = Remote::new(&config)?;
        let url = remote.url().to_string();
        let sandbox = Sandbox::with_backend(config, Backend::SandboxFusion(remote));
        let probe = Program::python(format!("print('{PROBE_OUTPUT}')"));
        let fail = |source: SandboxError| SandboxError::RemoteUnavailable {
            url: url.clone(),
            source: Box::new(source),
        };
        match sandbox.run(&probe).await {
            Ok(e) if e.verdict == Verdict::Passed && e.stdout.trim() == PROBE_OUTPUT => Ok(sandbox),
            Ok(e) => Err(fail(SandboxError::RemoteGarbage {
                url: url.clone(),
                reason: format!(
                    "a trivial program ended as {} (exit {:?}), stdout {:?}, stderr {:?}",
                    e.verdict,
                    e.exit_code,
                    e.stdout.trim(),
                    e.stderr.trim()
                ),
                source: None,
            })),
            Err(e) => Err(fail(e)),
        }
    }

    fn with_backend(config: SandboxConfig, backend: Backend) -> Sandbox {
        Sandbox {
            inner: Arc::new(Inner {
                limits: config.limits(),
                permits: Semaphore::new(config.workers),
                backend,
                config,
            }),
        }
    }

    async fn new_local(config: SandboxConfig) -> Result<Sandbox, SandboxError> {
        for (what, path) in [
            ("bubblewrap", config.bwrap.as_path()),
            ("prlimit (util-linux)", Path::new(PRLIMIT)),
            ("the Python interpreter", config.python.as_path()),
        ] {
            if let Err(source) = std::fs::metadata(path) {
                return Err(SandboxError::Unavailable {
                    reason: format!("{what} is not at {}", path.display()),
                    source: Some(source),
                });
            }
        }
        let is_root = std::fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .map_err(|source| SandboxError::Unavailable {
                reason: "cannot read /proc/self to learn our user".into(),
                source: Some(source),
            })?;
        let local = Local {
            run_as: is_root.then_some(NOBODY),
            scratch: config
                .scratch_dir
                .clone()
                .unwrap_or_else(std::env::temp_dir),
            system: system_args(),
        };
        let sandbox = Sandbox::with_backend(config, Backend::Local(local));
        let probe = Program::python(format!("print('{PROBE_OUTPUT}')"));
        let fail = |reason: String| SandboxError::Unavailable {
            reason,
            source: None,
        };
        match sandbox.run(&probe).await {
            Ok(e) if e.verdict == Verdict::Passed && e.stdout.trim() == PROBE_OUTPUT => Ok(sandbox),
            Ok(e) => Err(fail(format!(
                "a trivial program ended as {} (exit {:?}): {}",
                e.verdict,
                e.exit_code,
                e.stderr.trim()
            ))),
            Err(SandboxError::Setup { message }) => Err(fail(message)),
            Err(SandboxError::Spawn { bwrap, source }) => Err(SandboxError::Unavailable {
                reason: format!("{} does not start", bwrap.display()),
                source: Some(source),
            }),
            Err(e) => Err(fail(e.to_string())),
        }
    }

    /// The settings.
    pub fn config(&self) -> &SandboxConfig {
        &self.inner.config
    }

    /// Remote requests sent again after a transient failure, so far (0 for the local
    /// sandbox): a count for logs and tests.
    pub fn remote_retries(&self) -> u64 {
        match &self.inner.backend {
            Backend::Local(_) => 0,
            Backend::SandboxFusion(r) => r.retried(),
        }
    }

    /// Runs `program` once (waiting for a free worker first) and says how it fared. An
    /// error means the sandbox failed, not the program.
    pub async fn run(&self, program: &Program) -> Result<Execution, SandboxError> {
        let inner = &self.inner;
        if program.source.len() > MAX_SOURCE_BYTES {
            return Err(SandboxError::TooLarge {
                bytes: program.source.len(),
            });
        }
        let queue = Duration::from_secs_f64(inner.config.queue_timeout_secs);
        let _permit = match tokio::time::timeout(queue, inner.permits.acquire()).await {
            Ok(Ok(p)) => p,
            // The semaphore is never closed; treat it like a wedged pool all the same.
            Ok(Err(_)) | Err(_) => return Err(SandboxError::QueueTimeout(queue)),
        };
        match &inner.backend {
            Backend::Local(local) => run_local(inner, local, program).await,
            Backend::SandboxFusion(remote) => remote.run(program, &inner.limits).await,
        }
    }
}

/// One execution in bubblewrap (the caller holds a worker permit).
async fn run_local(
    inner: &Inner,
    local: &Local,
    program: &Program,
) -> Result<Execution, SandboxError> {
    let dir = write_program(&local.scratch, program).await?;
    let mut cmd = Command::new(&inner.config.bwrap);
    cmd.args(bwrap_args(inner, local, &dir.0, program))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/tmp")
        .env("LANG", "C.UTF-8")
        .env("PYTHONIOENCODING", "utf-8")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // A dropped execution (a cancelled trajectory) still kills its sandbox.
        .kill_on_drop(true)
        .process_group(0);
    if let Some(uid) = local.run_as {
        cmd.uid(uid).gid(uid);
    }
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(|source| SandboxError::Spawn {
        bwrap: inner.config.bwrap.clone(),
        source,
    })?;
    // Declared after `child`, so dropped before it: a cancelled execution kills the init
    // first, then `kill_on_drop` our `bwrap`.
    let mut guard = InitGuard { bwrap: child.id() };
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let cap = inner.limits.output_bytes;
    let mut out = Vec::new();
    let mut err = Vec::new();
    let io = async {
        tokio::try_join!(
            feed(stdin, &program.stdin),
            read_capped(stdout, &mut out, cap),
            read_capped(stderr, &mut err, cap),
        )
    };
    let wall = inner.limits.wall;
    let ended = match tokio::time::timeout(wall, io).await {
        // Both streams closed: every process in the sandbox has exited (or closed them),
        // so the exit is near; still bounded by what is left of the deadline.
        Ok(Ok(_)) => {
            let left = wall.saturating_sub(start.elapsed());
            match tokio::time::timeout(left, child.wait()).await {
                Ok(Ok(status)) => Ended::Exited(exit_code(status)),
                Ok(Err(e)) => {
                    kill(&mut child).await?;
                    guard.bwrap = None;
                    return Err(SandboxError::Io(e));
                }
                Err(_) => Ended::Killed(Verdict::Timeout),
            }
        }
        Ok(Err(Stop::Overflow)) => Ended::Killed(Verdict::OutputLimit),
        Ok(Err(Stop::Io(e))) => {
            kill(&mut child).await?;
            guard.bwrap = None;
            return Err(SandboxError::Io(e));
        }
        Err(_) => Ended::Killed(Verdict::Timeout),
    };
    if let Ended::Killed(_) = ended {
        kill(&mut child).await?;
    }
    // Reaped: its pid may be reused from here on, so nothing may be killed by it.
    guard.bwrap = None;
    let wall_time = start.elapsed();
    drop(dir);
    let stdout = String::from_utf8_lossy(&out).into_owned();
    let stderr = String::from_utf8_lossy(&err).into_owned();
    let (verdict, exit_code) = match ended {
        Ended::Killed(v) => (v, None),
        Ended::Exited(code) => {
            if let Some(message) = setup_failure(code, &stdout, &stderr) {
                return Err(SandboxError::Setup { message });
            }
            let expected = program.expected_stdout.as_deref();
            (
                classify(program.language, code, &stdout, &stderr, expected),
                Some(code),
            )
        }
    };
    Ok(Execution {
        verdict,
        stdout,
        stderr,
        exit_code,
        wall: wall_time,
    })
}

/// Kills the namespace's init when an execution is dropped before its end (a cancelled
/// trajectory), before `kill_on_drop` takes our `bwrap`. Killing `bwrap` alone leaves the init
/// to its parent-death signal, which an init caught between its creation and setting that
/// signal never receives: such inits were found left behind, sleeping, one per run that ended
/// with executions in flight. Holds our `bwrap`'s pid only until it is reaped.
struct InitGuard {
    bwrap: Option<u32>,
}

impl Drop for InitGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.bwrap.take() {
            for init in children_of(pid) {
                let _ = rustix::process::kill_process(init, rustix::process::Signal::KILL);
            }
        }
    }
}

/// Kills the sandbox and reaps it, within [`KILL_GRACE`]; when this returns, no process of
/// the sandbox is left.
///
/// The namespace's init (the child of the `bwrap` we spawned) is killed first: the kernel
/// then kills every other process in its PID namespace, and the init's exit completes only
/// once they are gone, after which our `bwrap` exits by itself. Killing only our `bwrap`
/// would end the rest through `--die-with-parent`, but asynchronously, after we returned.
async fn kill(child: &mut tokio::process::Child) -> Result<(), SandboxError> {
    let inits = child.id().map(children_of).unwrap_or_default();
    for pid in &inits {
        // It may have exited meanwhile; the wait below tells.
        let _ = rustix::process::kill_process(*pid, rustix::process::Signal::KILL);
    }
    if !inits.is_empty() {
        match tokio::time::timeout(KILL_GRACE, child.wait()).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => return Err(SandboxError::Io(e)),
            Err(_) => {}
        }
    }
    // No init yet (killed during set-up), or our `bwrap` outlived it.
    let _ = child.start_kill();
    match tokio::time::timeout(KILL_GRACE, child.wait()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(SandboxError::Io(e)),
        Err(_) => Err(SandboxError::Unreaped(KILL_GRACE)),
    }
}

/// The children of process `pid` (from `/proc/PID/task/PID/children`).
fn children_of(pid: u32) -> Vec<rustix::process::Pid> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter_map(rustix::process::Pid::from_raw)
        .collect()
}

/// Writes the program's input and closes it. A program that exits without reading all of it
/// breaks the pipe; that is its choice, not an error.
async fn feed(stdin: Option<tokio::process::ChildStdin>, bytes: &[u8]) -> Result<(), Stop> {
    if let Some(mut w) = stdin {
        if !bytes.is_empty() {
            let _ = w.write_all(bytes).await;
        }
    }
    Ok(())
}

/// Reads `r` to its end into `buf`, keeping at most `cap` bytes; more is [`Stop::Overflow`].
async fn read_capped<R: AsyncRead + Unpin>(
    r: Option<R>,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<(), Stop> {
    let Some(mut r) = r else { return Ok(()) };
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = r.read(&mut chunk).await.map_err(Stop::Io)?;
        if n == 0 {
            return Ok(());
        }
        let room = cap.saturating_sub(buf.len());
        if n > room {
            buf.extend_from_slice(&chunk[..room]);
            return Err(Stop::Overflow);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// bubblewrap reports a child killed by signal `s` as exit status `128 + s`; a `bwrap`
/// killed itself is reported the same way.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// Signal numbers (Linux) behind the CPU-time limit: `SIGXCPU` at the soft limit, `SIGKILL`
/// at the hard one.
const SIGKILL: i32 = 9;
const SIGXCPU: i32 = 24;

/// The verdict of a program that exited with `code` by itself (locally, or on the remote
/// sandbox, which reports the same code, output and stderr).
pub(crate) fn classify(
    language: Language,
    code: i32,
    stdout: &str,
    stderr: &str,
    expected: Option<&str>,
) -> Verdict {
    if code == 0 {
        return match expected {
            Some(e) if normalise_output(stdout) != normalise_output(e) => Verdict::WrongAnswer,
            _ => Verdict::Passed,
        };
    }
    let last = stderr
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    if language.is_syntax_error(last) {
        Verdict::SyntaxError
    } else if language.is_memory_error(last) {
        Verdict::Memory
    } else if language.is_failed_check(last) {
        Verdict::WrongAnswer
    } else if code == 128 + SIGXCPU || code == 128 + SIGKILL {
        // Nothing of ours sends a signal to a sandbox that is still inside its deadline, so a
        // killed program hit its CPU limit (or killed itself, which it may call a timeout).
        Verdict::Timeout
    } else {
        Verdict::RuntimeError
    }
}

/// bubblewrap's or prlimit's own failure (status 1, their prefix, nothing on stdout): the
/// sandbox did not start, so there is no verdict. A program could print the same to fail
/// its own execution as an error; it gains nothing by it.
fn setup_failure(code: i32, stdout: &str, stderr: &str) -> Option<String> {
    let first = stderr.lines().next().unwrap_or("");
    (code == 1
        && stdout.is_empty()
        && (first.starts_with("bwrap: ") || first.starts_with("prlimit: ")))
    .then(|| stderr.trim().to_string())
}

/// `--symlink` or `--ro-bind` for each of [`SYSTEM_LINKS`] this host has.
fn system_args() -> Vec<OsString> {
    let mut args = Vec::new();
    for p in SYSTEM_LINKS {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            if let Ok(target) = std::fs::read_link(p) {
                args.extend(["--symlink".into(), target.into_os_string(), p.into()]);
            }
        } else if meta.is_dir() {
            args.extend(["--ro-bind".into(), p.into(), p.into()]);
        }
    }
    args
}

/// The whole `bwrap` command line for one execution, the program's file in `dir`.
fn bwrap_args(inner: &Inner, local: &Local, dir: &Path, program: &Program) -> Vec<OsString> {
    let l = &inner.limits;
    let mut a: Vec<OsString> = [
        // Every namespace, the user one required (not "try"): without it the process limit
        // would not be per sandbox, and `--disable-userns` needs it.
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    a.extend(local.system.iter().cloned());
    a.extend(
        ["--proc", "/proc", "--dev", "/dev", "--size"]
            .iter()
            .map(OsString::from),
    );
    a.push(l.tmpfs_bytes.to_string().into());
    a.extend(["--tmpfs", "/tmp", "--ro-bind"].iter().map(OsString::from));
    a.push(dir.into());
    a.extend(
        [
            "/box",
            // bwrap's root and `/dev` are tmpfs of its own, unbounded in size: read-only, so
            // the capped `/tmp` is the only place a program can write (device nodes such as
            // `/dev/null` still accept writes).
            "--remount-ro",
            "/",
            "--remount-ro",
            "/dev",
            "--chdir",
            "/tmp",
            "--",
            PRLIMIT,
        ]
        .iter()
        .map(OsString::from),
    );
    let cpu = l.cpu.as_secs().max(1);
    a.extend(
        [
            // Soft limit: SIGXCPU; a second later the hard limit's SIGKILL, for programs
            // that catch the first.
            format!("--cpu={cpu}:{}", cpu + 1),
            format!("--as={}", l.memory_bytes),
            format!("--nproc={}", l.processes),
            format!("--fsize={}", l.tmpfs_bytes),
            format!("--nofile={}", l.open_files),
            "--core=0".into(),
            "--".into(),
        ]
        .into_iter()
        .map(OsString::from),
    );
    let source = format!("/box/{}", program.language.file_name());
    a.extend(
        program
            .language
            .argv(&inner.config.python, &source)
            .into_iter()
            .map(OsString::from),
    );
    a.extend(program.args.iter().map(OsString::from));
    a
}

/// A fresh host directory holding the program file, readable by the sandbox's user. The
/// file system calls run on the blocking pool, off the runtime's workers.
async fn write_program(scratch: &Path, program: &Program) -> Result<ScratchDir, SandboxError> {
    let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
    let dir = scratch.join(format!("rollflash-sandbox-{}-{n}", std::process::id()));
    let file = dir.join(program.language.file_name());
    let source = program.source.clone();
    let task = tokio::task::spawn_blocking(move || write_program_blocking(dir, &file, &source));
    match task.await {
        Ok(r) => r,
        Err(e) => Err(SandboxError::Scratch {
            path: scratch.to_path_buf(),
            source: std::io::Error::other(e),
        }),
    }
}

fn write_program_blocking(
    dir: PathBuf,
    file: &Path,
    source: &str,
) -> Result<ScratchDir, SandboxError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SandboxError::Scratch { path, source }
    };
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&dir)
        .map_err(err(&dir))?;
    let dir = ScratchDir(dir);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(file)
        .map_err(err(file))?;
    f.write_all(source.as_bytes()).map_err(err(file))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_exit_passes_unless_its_output_differs() {
        let py = Language::Python;
        assert_eq!(classify(py, 0, "3\n", "", None), Verdict::Passed);
        assert_eq!(classify(py, 0, " 3  \n\n", "", Some("3")), Verdict::Passed);
        assert_eq!(classify(py, 0, "4\n", "", Some("3")), Verdict::WrongAnswer);
    }

    #[test]
    fn failures_are_told_apart_by_the_last_line_of_stderr() {
        let py = Language::Python;
        let tb = |last: &str| format!("Traceback (most recent call last):\n  File x\n{last}\n");
        assert_eq!(
            classify(py, 1, "", &tb("SyntaxError: invalid syntax"), None),
            Verdict::SyntaxError
        );
        assert_eq!(
            classify(py, 1, "", &tb("IndentationError: x"), None),
            Verdict::SyntaxError
        );
        assert_eq!(
            classify(py, 1, "", &tb("MemoryError"), None),
            Verdict::Memory
        );
        assert_eq!(
            classify(py, 1, "", &tb("AssertionError"), None),
            Verdict::WrongAnswer
        );
        assert_eq!(
            classify(py, 1, "", &tb("ZeroDivisionError: x"), None),
            Verdict::RuntimeError
        );
        assert_eq!(classify(py, 152, "", "", None), Verdict::Timeout);
        assert_eq!(classify(py, 3, "", "", None), Verdict::RuntimeError);
    }

    #[test]
    fn only_bubblewrap_s_own_failure_is_a_setup_error() {
        assert!(
            setup_failure(1, "", "bwrap: No permissions to creating new namespace\n").is_some()
        );
        assert!(setup_failure(1, "x", "bwrap: no\n").is_none());
        assert!(setup_failure(2, "", "bwrap: no\n").is_none());
        assert!(setup_failure(1, "", "Traceback\n").is_none());
    }
}
