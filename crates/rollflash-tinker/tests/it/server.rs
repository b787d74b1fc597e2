//! The real SkyRL Tinker server of this test binary: set up (or found set up) by
//! `scripts/setup_tinker_server.sh`, started once by `scripts/start_tinker_server.sh`, and
//! stopped (SIGTERM to its `uv` process, then SIGKILL to its group) when the guard drops.
//!
//! `ROLLFLASH_TINKER_URL` points the tests at a server that is already running instead
//! (it is then left running).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A running server and what the tests need beside it.
pub struct Server {
    pub url: String,
    /// The served model, named exactly as the server names it.
    pub model: String,
    /// The server venv's python (with the tinker 0.25 SDK), for the SDK cross-check.
    pub python: PathBuf,
    /// The `uv` pid to stop, if we started it.
    pid: Option<u32>,
    pub run_dir: Option<PathBuf>,
    _tmp: Option<tempfile::TempDir>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kv(out: &str, key: &str) -> Option<String> {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
}

/// Why there is no server: `Err(Skip)` ends the test quietly, anything else fails it.
pub enum NoServer {
    Skip(String),
    Fail(String),
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Sets up and starts the server (blocking; a minute warm, two cold).
pub fn start() -> Result<Server, NoServer> {
    let setup = Command::new(repo_root().join("scripts/setup_tinker_server.sh"))
        .output()
        .map_err(|e| NoServer::Fail(format!("cannot run setup_tinker_server.sh: {e}")))?;
    let setup_out = String::from_utf8_lossy(&setup.stdout).into_owned();
    let setup_err = String::from_utf8_lossy(&setup.stderr).into_owned();
    match setup.status.code() {
        Some(0) => {}
        // 2: no Python 3.12 here; 3: the install could not be fetched (no PyPI).
        Some(code @ (2 | 3)) => {
            return Err(NoServer::Skip(format!(
                "setup_tinker_server.sh exited {code}: {}",
                setup_err.trim()
            )))
        }
        other => {
            return Err(NoServer::Fail(format!(
                "setup_tinker_server.sh failed ({other:?}): {setup_err}"
            )))
        }
    }
    let venv =
        kv(&setup_out, "TINKER_VENV").ok_or_else(|| NoServer::Fail("no TINKER_VENV".into()))?;
    let model_dir =
        kv(&setup_out, "TINKER_MODEL").ok_or_else(|| NoServer::Fail("no TINKER_MODEL".into()))?;
    let python = PathBuf::from(&venv).join("bin/python");

    if let Ok(url) = std::env::var("ROLLFLASH_TINKER_URL") {
        return Ok(Server {
            url,
            model: std::env::var("ROLLFLASH_TINKER_MODEL").unwrap_or(model_dir),
            python,
            pid: None,
            run_dir: None,
            _tmp: None,
        });
    }

    let tmp = tempfile::tempdir().map_err(|e| NoServer::Fail(e.to_string()))?;
    let run_dir = tmp.path().join("run");
    let port = free_port();
    let t0 = Instant::now();
    let out = Command::new(repo_root().join("scripts/start_tinker_server.sh"))
        .arg(port.to_string())
        .arg(&run_dir)
        .output()
        .map_err(|e| NoServer::Fail(format!("cannot run start_tinker_server.sh: {e}")))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(NoServer::Fail(format!(
            "start_tinker_server.sh failed ({:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let pid = kv(&stdout, "TINKER_PID").and_then(|p| p.parse().ok());
    let server = Server {
        url: kv(&stdout, "TINKER_URL").unwrap_or_else(|| format!("http://127.0.0.1:{port}")),
        model: kv(&stdout, "TINKER_MODEL").unwrap_or(model_dir),
        python,
        pid,
        run_dir: Some(run_dir),
        _tmp: Some(tmp),
    };
    eprintln!(
        "tinker server ready at {} in {:.1} s",
        server.url,
        t0.elapsed().as_secs_f64()
    );
    Ok(server)
}

impl Server {
    /// The server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let Some(dir) = &self.run_dir else {
            return String::new();
        };
        let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let Some(pid) = self.pid else { return };
        // uv forwards SIGTERM to the API, which stops its engine; the group kill is for a
        // server that did not stop in time.
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            let alive = Command::new("kill")
                .args(["-0", &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !alive {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stderr(std::process::Stdio::null())
            .status();
    }
}
