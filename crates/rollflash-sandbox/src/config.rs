//! The sandbox's settings (the `[sandbox]` section of a run's config): which sandbox (local
//! bubblewrap or a remote SandboxFusion server), pool size, limits, where `bwrap` and the
//! interpreter are, and the remote server's address, key and retries. Defaults and
//! validation live here, once.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A setting out of range, named by its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sandbox.{field}: {reason}")]
pub struct ConfigError {
    /// The field, as the config file spells it.
    pub field: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

/// Where programs run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxKind {
    /// On this machine, in bubblewrap (the crate docs say how it is contained).
    #[default]
    Local,
    /// On a SandboxFusion server (bytedance/SandboxFusion), through its `POST /run_code`:
    /// for users who already run one, or whose machines cannot run bubblewrap. Containment is
    /// then that server's business.
    SandboxFusion,
}

/// How the sandbox runs programs. Every limit applies to one execution.
///
/// With `kind = "sandbox_fusion"`, `workers`, `wall_secs` (sent as `run_timeout`),
/// `memory_mb` (sent as `memory_limit_MB`), `output_bytes` (applied here, to what the server
/// returns) and `queue_timeout_secs` apply; `cpu_secs`, `processes`, `tmpfs_mb`,
/// `open_files`, `bwrap`, `python` and `scratch_dir` are the local sandbox's only (the
/// server applies its own). `url`, `api_key_env`, `retries` and `remote_margin_secs` are the
/// remote sandbox's only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// Which sandbox runs the programs: `"local"` (bubblewrap, the default) or
    /// `"sandbox_fusion"` (a remote server at `url`). Either way a sandbox that cannot run
    /// programs stops the run at its start; nothing ever falls back to the other, or to
    /// running unsandboxed.
    pub kind: SandboxKind,
    /// Executions that may run at once; more wait for a slot. Each is a process tree that may
    /// use a full core, so more than the cores given to rewards only adds queueing.
    pub workers: usize,
    /// Wall-clock deadline of one execution, from spawn to exit, in seconds: past it the tree
    /// is killed ([`crate::Verdict::Timeout`]). Catches sleeping and blocked programs, which
    /// the CPU limit does not.
    pub wall_secs: f64,
    /// CPU seconds of each process (`RLIMIT_CPU`): the kernel kills a spinning process even
    /// if the host side were slow to notice the wall deadline.
    pub cpu_secs: u64,
    /// Address space of each process, in MiB (`RLIMIT_AS`): a large allocation fails inside
    /// the program (Python's `MemoryError`) instead of pressing on the host's memory.
    pub memory_mb: u64,
    /// Processes (and threads) the program may have at once (`RLIMIT_NPROC`, counted in the
    /// sandbox's own user namespace, so concurrent executions do not share it). Includes the
    /// sandbox's own init and the interpreter.
    pub processes: u64,
    /// Bytes kept of stdout and of stderr each; a program that writes more is killed
    /// ([`crate::Verdict::OutputLimit`]) rather than read without bound.
    pub output_bytes: usize,
    /// Size of the private tmpfs the program runs in, in MiB; also its largest file
    /// (`RLIMIT_FSIZE`). tmpfs pages are memory, so this bounds what writes can hold.
    pub tmpfs_mb: u64,
    /// Open file descriptors per process (`RLIMIT_NOFILE`).
    pub open_files: u64,
    /// Longest wait for a free worker, in seconds, before an execution fails with
    /// [`crate::SandboxError::QueueTimeout`]; a bound on a pool wedged by a bug, since each
    /// execution already ends within its wall deadline.
    pub queue_timeout_secs: f64,
    /// The bubblewrap binary (`scripts/setup_sandbox.sh` installs it).
    pub bwrap: PathBuf,
    /// The Python interpreter, a path under `/usr` (the only host tree the sandbox sees).
    pub python: PathBuf,
    /// Where each execution's program file is written on the host (then bound read-only into
    /// the sandbox and removed); `None` = the system temporary directory. Must be readable by
    /// the unprivileged user the sandbox runs as.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scratch_dir: Option<PathBuf>,
    /// The SandboxFusion server's base URL (`http://host:8080`; `/run_code` is appended).
    /// Required with `kind = "sandbox_fusion"`, refused otherwise (a `url` under a local
    /// sandbox is a forgotten `kind`, and would silently run locally).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The name of an environment variable holding an API key, sent as
    /// `Authorization: Bearer <key>`; read once, when the sandbox starts, and an unset
    /// variable is an error there. The name, not the key, so the key stays out of config
    /// files and of the run's saved config. `None`: no header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Further attempts of a request that failed transiently (no connection, HTTP 5xx, 408
    /// or 429, or the server's own `SandboxError` status), after backoffs of 0.2 s doubling
    /// up to 5 s. A request past its deadline is not retried (see `remote_margin_secs`).
    pub retries: u32,
    /// Seconds a request may take beyond `wall_secs` before the client gives up on it: the
    /// network, the server's own queue and its interpreter's start. One request's deadline
    /// is `wall_secs + remote_margin_secs`; the server enforces `wall_secs` on the program
    /// itself, so a request past that deadline means the server is stuck or swamped, and is
    /// not sent again (that would add load to a swamped server and stretch the step past
    /// the environment's step timeout).
    pub remote_margin_secs: f64,
}

impl Default for SandboxConfig {
    fn default() -> SandboxConfig {
        SandboxConfig {
            workers: 2,
            wall_secs: 10.0,
            cpu_secs: 8,
            memory_mb: 1024,
            processes: 32,
            output_bytes: 1 << 20,
            tmpfs_mb: 32,
            open_files: 64,
            queue_timeout_secs: 600.0,
            bwrap: PathBuf::from("/usr/bin/bwrap"),
            python: PathBuf::from("/usr/bin/python3"),
            scratch_dir: None,
            kind: SandboxKind::Local,
            url: None,
            api_key_env: None,
            retries: 3,
            remote_margin_secs: 10.0,
        }
    }
}

/// The limits of one execution, typed (from [`SandboxConfig::limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock deadline.
    pub wall: Duration,
    /// CPU time per process.
    pub cpu: Duration,
    /// Address space per process, bytes.
    pub memory_bytes: u64,
    /// Processes at once.
    pub processes: u64,
    /// Bytes kept of each output stream.
    pub output_bytes: usize,
    /// Size of the working tmpfs (and largest file), bytes.
    pub tmpfs_bytes: u64,
    /// Open files per process.
    pub open_files: u64,
}

fn bad(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        reason: reason.into(),
    }
}

fn positive_secs(field: &'static str, v: f64) -> Result<(), ConfigError> {
    // One day: a bound far past any test, that still keeps `Duration` arithmetic finite.
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(bad(
            field,
            format!("must be in (0, 86400] seconds, got {v}"),
        ));
    }
    Ok(())
}

/// A base URL the client can call: plain `http://` with a host.
fn check_url(url: &str) -> Result<(), ConfigError> {
    // This build's HTTP client has no TLS (the workspace's `reqwest` has no TLS feature), so
    // an https URL would fail on every request; say so here instead.
    if url.starts_with("https://") {
        return Err(bad(
            "url",
            format!(
                "{url}: https is not supported by this build; use the server's plain-http \
                 address (or a local proxy that terminates TLS)"
            ),
        ));
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(bad("url", format!("{url}: must start with http://")));
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty() || rest.contains(char::is_whitespace) {
        return Err(bad(
            "url",
            format!("{url}: must be http://host[:port][/path]"),
        ));
    }
    Ok(())
}

impl SandboxConfig {
    /// Checks every value; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers == 0 || self.workers > 1024 {
            return Err(bad(
                "workers",
                format!("must be in 1..=1024, got {}", self.workers),
            ));
        }
        positive_secs("wall_secs", self.wall_secs)?;
        positive_secs("queue_timeout_secs", self.queue_timeout_secs)?;
        if self.cpu_secs == 0 {
            return Err(bad("cpu_secs", "must be at least 1"));
        }
        // Below ~64 MiB the interpreter itself cannot start, which would score every program
        // as out of memory.
        if self.memory_mb < 64 {
            return Err(bad(
                "memory_mb",
                format!("must be at least 64, got {}", self.memory_mb),
            ));
        }
        // The sandbox's init and the interpreter take two.
        if self.processes < 2 {
            return Err(bad(
                "processes",
                format!("must be at least 2, got {}", self.processes),
            ));
        }
        if self.output_bytes == 0 {
            return Err(bad("output_bytes", "must be at least 1"));
        }
        if self.tmpfs_mb == 0 {
            return Err(bad("tmpfs_mb", "must be at least 1"));
        }
        // The interpreter's standard streams and imports need a few.
        if self.open_files < 16 {
            return Err(bad(
                "open_files",
                format!("must be at least 16, got {}", self.open_files),
            ));
        }
        self.validate_remote()?;
        if !self.bwrap.is_absolute() {
            return Err(bad("bwrap", "must be an absolute path"));
        }
        if !self.python.starts_with("/usr") {
            return Err(bad(
                "python",
                format!(
                    "must be under /usr, the only host tree the sandbox sees; got {}",
                    self.python.display()
                ),
            ));
        }
        Ok(())
    }

    /// The remote sandbox's settings: present exactly when it is the one chosen.
    fn validate_remote(&self) -> Result<(), ConfigError> {
        if self.retries > 10 {
            return Err(bad(
                "retries",
                format!("must be in 0..=10, got {}", self.retries),
            ));
        }
        positive_secs("remote_margin_secs", self.remote_margin_secs)?;
        match self.kind {
            SandboxKind::Local => {
                let only_remote = |field| {
                    bad(
                        field,
                        "is only used with kind = \"sandbox_fusion\"; the sandbox is local",
                    )
                };
                if self.url.is_some() {
                    return Err(only_remote("url"));
                }
                if self.api_key_env.is_some() {
                    return Err(only_remote("api_key_env"));
                }
            }
            SandboxKind::SandboxFusion => {
                let Some(url) = &self.url else {
                    return Err(bad(
                        "url",
                        "is required with kind = \"sandbox_fusion\" (the server's base URL, \
                         such as http://127.0.0.1:8080)",
                    ));
                };
                check_url(url)?;
                if let Some(var) = &self.api_key_env {
                    if var.is_empty() || var.contains('=') || var.contains('\0') {
                        return Err(bad(
                            "api_key_env",
                            format!("must name an environment variable, got {var:?}"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The longest one execution may take before it ends with a verdict or an error: the
    /// wall deadline, plus the network margin for a remote sandbox (one attempt; retries
    /// come on top). A caller's own deadline on a run must be longer.
    pub fn execution_deadline(&self) -> Duration {
        let margin = match self.kind {
            SandboxKind::Local => 0.0,
            SandboxKind::SandboxFusion => self.remote_margin_secs,
        };
        Duration::from_secs_f64(self.wall_secs + margin)
    }

    /// The typed limits.
    pub fn limits(&self) -> Limits {
        Limits {
            wall: Duration::from_secs_f64(self.wall_secs),
            cpu: Duration::from_secs(self.cpu_secs),
            memory_bytes: self.memory_mb.saturating_mul(1 << 20),
            processes: self.processes,
            output_bytes: self.output_bytes,
            tmpfs_bytes: self.tmpfs_mb.saturating_mul(1 << 20),
            open_files: self.open_files,
        }
    }
}
