//! `LocalServer`: a real SkyRL 0.4.0 Tinker server on this machine, for tests of everything
//! that speaks the protocol (this crate's client, the rollout backend, the learner).
//!
//! It owns the server's lifetime: `scripts/setup_tinker_server.sh` installs it (idempotent; a
//! finished install is reused offline), `scripts/start_tinker_server.sh` starts it on a free
//! port with its own run directory (SQLite database, checkpoints, log) in a temporary
//! directory, and dropping the guard stops it: SIGTERM to the `uv` process that leads its
//! process group (uv passes it on; API and engine exit within a second), then SIGKILL to the
//! whole group after a bounded wait. Each guard has its own port, run directory and database,
//! so test binaries running at once each get a server of their own.
//!
//! Fault tests use [`LocalServer::kill9`] (the whole process group, as a crash would) and
//! [`LocalServer::restart`] (same port, same run directory and database, so sessions, models
//! and checkpoints saved before are still there).
//!
//! `ROLLFLASH_TINKER_URL` points at a server that is already running instead (then also
//! `ROLLFLASH_TINKER_MODEL`, its served model name); it is left running, and `kill9`/`restart`
//! refuse.
//!
//! The calls block (a start takes about a minute with a warm JAX cache, two cold): from async
//! code, call them in `tokio::task::spawn_blocking`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a SIGTERMed server may take before its group is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long a killed group may take to disappear.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// Tries of a start that lost its port to another process between our probe and its bind.
const PORT_TRIES: usize = 3;

/// Why there is no local server.
#[derive(Debug, thiserror::Error)]
pub enum LocalServerError {
    /// This machine cannot run one (no Python 3.12, the install could not be fetched): tests
    /// skip, printing the reason.
    #[error("no local Tinker server: {0}")]
    Unavailable(String),
    /// It should run here and did not: tests fail.
    #[error("local Tinker server: {reason}")]
    Failed {
        reason: String,
        /// The end of the server's log, when there is one.
        log_tail: String,
    },
    /// `kill9`/`restart` on a server this process did not start (`ROLLFLASH_TINKER_URL`).
    #[error("the Tinker server at {0} was not started here")]
    External(String),
}

impl LocalServerError {
    fn failed(reason: impl Into<String>) -> LocalServerError {
        LocalServerError::Failed {
            reason: reason.into(),
            log_tail: String::new(),
        }
    }
}

/// A running SkyRL Tinker server (see the module docs). Stopped on drop.
#[derive(Debug)]
pub struct LocalServer {
    url: String,
    port: u16,
    /// The Hugging Face directory it serves (config.json: vocabulary and shapes).
    model_dir: PathBuf,
    /// The served model's name: SkyRL names it by the exact `--base-model` string.
    base_model: String,
    /// The server venv's python, which has the tinker 0.25 SDK (for SDK cross-checks).
    python: PathBuf,
    /// Our server: its run directory, and the `uv` pid leading its process group while it runs.
    own: Option<Own>,
}

#[derive(Debug)]
struct Own {
    run_dir: PathBuf,
    pid: Option<u32>,
    /// Removes the run directory when the guard drops.
    _tmp: tempfile::TempDir,
}

/// What `setup_tinker_server.sh` reported.
struct Setup {
    venv: PathBuf,
    model_dir: PathBuf,
}

fn scripts_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts");
    dir.canonicalize().unwrap_or(dir)
}

fn kv(out: &str, key: &str) -> Option<String> {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
}

fn setup() -> Result<Setup, LocalServerError> {
    let out = Command::new("bash")
        .arg(scripts_dir().join("setup_tinker_server.sh"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LocalServerError::failed(format!("cannot run setup_tinker_server.sh: {e}")))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    match out.status.code() {
        Some(0) => {}
        // 2: no Python 3.12 here; 3: the install could not be fetched (no PyPI).
        Some(code @ (2 | 3)) => {
            return Err(LocalServerError::Unavailable(format!(
                "setup_tinker_server.sh exited {code}: {}",
                last_lines(&stderr, 5)
            )))
        }
        other => {
            return Err(LocalServerError::Failed {
                reason: format!("setup_tinker_server.sh failed ({other:?})"),
                log_tail: last_lines(&stderr, 40),
            })
        }
    }
    let venv = kv(&stdout, "TINKER_VENV")
        .ok_or_else(|| LocalServerError::failed("setup printed no TINKER_VENV"))?;
    let model_dir = kv(&stdout, "TINKER_MODEL")
        .ok_or_else(|| LocalServerError::failed("setup printed no TINKER_MODEL"))?;
    Ok(Setup {
        venv: venv.into(),
        model_dir: model_dir.into(),
    })
}

fn free_port() -> Result<u16, LocalServerError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| LocalServerError::failed(format!("no free port: {e}")))
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Whether `pid` is a live process (a zombie is not: it holds no port and runs nothing).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Whether any process of group `pgid` is still alive.
fn group_alive(pgid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return alive(pgid);
    };
    entries.flatten().any(|e| {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            return false;
        };
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let (_, rest) = stat.rsplit_once(')')?;
                let mut f = rest.split_whitespace();
                let state = f.next()?;
                // Fields after the name: state, ppid, pgrp.
                let pgrp = f.nth(1)?.parse::<u32>().ok()?;
                Some(pgrp == pgid && state != "Z" && state != "X")
            })
            .unwrap_or(false)
    })
}

fn signal(sig: &str, target: &str) {
    // A process that is already gone is what we want; the result says nothing more.
    let _ = Command::new("kill")
        .args([sig, "--", target])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn wait_until(deadline: Duration, mut done: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

impl LocalServer {
    /// Installs (if needed) and starts a server serving the tiny model on a free port, and
    /// waits until its engine is ready. Blocking.
    pub fn start() -> Result<LocalServer, LocalServerError> {
        Self::start_with(None)
    }

    /// As [`LocalServer::start`], serving the Hugging Face directory `model_dir` (one the
    /// server's backend can load) instead of the tiny model.
    pub fn start_serving(model_dir: &Path) -> Result<LocalServer, LocalServerError> {
        Self::start_with(Some(model_dir))
    }

    fn start_with(model: Option<&Path>) -> Result<LocalServer, LocalServerError> {
        let setup = setup()?;
        let model_dir = model.map_or_else(|| setup.model_dir.clone(), Path::to_path_buf);
        let python = setup.venv.join("bin/python");
        if let Ok(url) = std::env::var("ROLLFLASH_TINKER_URL") {
            let url = url.trim_end_matches('/').to_string();
            let port = url
                .rsplit_once(':')
                .and_then(|(_, p)| p.trim_end_matches('/').parse().ok())
                .unwrap_or(0);
            let base_model = std::env::var("ROLLFLASH_TINKER_MODEL")
                .unwrap_or_else(|_| setup.model_dir.to_string_lossy().into_owned());
            return Ok(LocalServer {
                url,
                port,
                model_dir: setup.model_dir,
                base_model,
                python,
                own: None,
            });
        }
        let tmp = tempfile::Builder::new()
            .prefix("rollflash-tinker-")
            .tempdir()
            .map_err(|e| LocalServerError::failed(format!("cannot make a run directory: {e}")))?;
        let run_dir = tmp.path().join("run");
        let mut last = None;
        for _ in 0..PORT_TRIES {
            let port = free_port()?;
            match launch(port, &run_dir, &model_dir) {
                Ok(launched) => {
                    let base_model = launched
                        .model
                        .unwrap_or_else(|| model_dir.to_string_lossy().into_owned());
                    return Ok(LocalServer {
                        url: launched.url,
                        port,
                        model_dir,
                        base_model,
                        python,
                        own: Some(Own {
                            run_dir,
                            pid: Some(launched.pid),
                            _tmp: tmp,
                        }),
                    });
                }
                // Another process took the port between our probe and the server's bind.
                Err(Launch::PortTaken(e)) => last = Some(e),
                Err(Launch::Failed(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| LocalServerError::failed("no port could be bound")))
    }

    /// `http://127.0.0.1:PORT` (no `/api/v1`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The Hugging Face directory of the served model (read `config.json` for its shapes).
    pub fn model_dir(&self) -> &Path {
        &self.model_dir
    }

    /// The served model's name, as `create_model` and base-model sampling take it.
    pub fn base_model(&self) -> &str {
        &self.base_model
    }

    /// The server venv's python (it has the official tinker 0.25 SDK).
    pub fn python(&self) -> &Path {
        &self.python
    }

    /// The run directory (database, checkpoints, `server.log`), if this process started it.
    pub fn run_dir(&self) -> Option<&Path> {
        self.own.as_ref().map(|o| o.run_dir.as_path())
    }

    /// The last `n` lines of the server's log, for failure messages ("" for an external
    /// server).
    pub fn log_tail(&self, n: usize) -> String {
        let Some(dir) = self.run_dir() else {
            return String::new();
        };
        last_lines(
            &std::fs::read_to_string(dir.join("server.log")).unwrap_or_default(),
            n,
        )
    }

    fn own_mut(&mut self) -> Result<&mut Own, LocalServerError> {
        let url = self.url.clone();
        self.own.as_mut().ok_or(LocalServerError::External(url))
    }

    /// Kills the server's whole process group with SIGKILL, as a crash would, and waits
    /// until it is gone (the port is then free). Blocking.
    pub fn kill9(&mut self) -> Result<(), LocalServerError> {
        let own = self.own_mut()?;
        if let Some(pid) = own.pid.take() {
            signal("-KILL", &format!("-{pid}"));
            if !wait_until(KILL_WAIT, || !group_alive(pid)) {
                return Err(LocalServerError::failed(format!(
                    "process group {pid} still alive {KILL_WAIT:?} after SIGKILL"
                )));
            }
        }
        Ok(())
    }

    /// Starts the server again on the same port with the same run directory and database
    /// (stopping it first if it runs), and waits until it is ready. Blocking.
    pub fn restart(&mut self) -> Result<(), LocalServerError> {
        let port = self.port;
        let own = self.own_mut()?;
        if let Some(pid) = own.pid.take() {
            stop(pid);
        }
        let run_dir = own.run_dir.clone();
        let model_dir = self.model_dir.clone();
        let launched = launch(port, &run_dir, &model_dir).map_err(|e| match e {
            Launch::PortTaken(e) | Launch::Failed(e) => e,
        })?;
        self.own_mut()?.pid = Some(launched.pid);
        Ok(())
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        if let Some(pid) = self.own.as_mut().and_then(|o| o.pid.take()) {
            stop(pid);
        }
    }
}

/// SIGTERM to the `uv` leader (it passes the signal on and API and engine exit cleanly),
/// then SIGKILL to the group if anything of it is left after [`STOP_GRACE`].
fn stop(pid: u32) {
    signal("-TERM", &pid.to_string());
    if !wait_until(STOP_GRACE, || !group_alive(pid)) {
        signal("-KILL", &format!("-{pid}"));
        wait_until(KILL_WAIT, || !group_alive(pid));
    }
}

struct Launched {
    url: String,
    /// The served model's name, as the script reports it.
    model: Option<String>,
    pid: u32,
}

enum Launch {
    PortTaken(LocalServerError),
    Failed(LocalServerError),
}

/// Runs `start_tinker_server.sh PORT RUN_DIR MODEL_DIR`, which returns once the engine is
/// ready.
fn launch(port: u16, run_dir: &Path, model_dir: &Path) -> Result<Launched, Launch> {
    let out = Command::new("bash")
        .arg(scripts_dir().join("start_tinker_server.sh"))
        .arg(port.to_string())
        .arg(run_dir)
        .arg(model_dir)
        // The script's watchdog ends the server if this process dies without dropping it.
        .env("ROLLFLASH_PARENT_PID", std::process::id().to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            Launch::Failed(LocalServerError::failed(format!(
                "cannot run start_tinker_server.sh: {e}"
            )))
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        let log = std::fs::read_to_string(run_dir.join("server.log")).unwrap_or_default();
        let err = LocalServerError::Failed {
            reason: format!(
                "start_tinker_server.sh {port} failed ({:?}): {}",
                out.status.code(),
                last_lines(&stderr, 5)
            ),
            log_tail: last_lines(&log, 40),
        };
        // 8: something already answers on the port; 6 with a bind error: it lost the race.
        let taken = out.status.code() == Some(8)
            || (out.status.code() == Some(6) && log.contains("address already in use"));
        return Err(if taken {
            Launch::PortTaken(err)
        } else {
            Launch::Failed(err)
        });
    }
    let pid = kv(&stdout, "TINKER_PID")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| {
            Launch::Failed(LocalServerError::failed("the script printed no TINKER_PID"))
        })?;
    Ok(Launched {
        url: kv(&stdout, "TINKER_URL").unwrap_or_else(|| format!("http://127.0.0.1:{port}")),
        model: kv(&stdout, "TINKER_MODEL"),
        pid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_made_up_one_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
    }

    #[test]
    fn the_scripts_are_found() {
        assert!(scripts_dir().join("start_tinker_server.sh").is_file());
        assert!(scripts_dir().join("setup_tinker_server.sh").is_file());
    }
}
