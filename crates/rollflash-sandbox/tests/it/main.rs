//! Integration tests of the sandbox: ordinary programs (`basics.rs`), hostile ones
//! (`hostile.rs`), and many executions in a row leaving the machine as found (`leaks.rs`).
//! Each test skips, saying why, where bubblewrap cannot run (`scripts/setup_sandbox.sh`
//! installs it). The remote sandbox's tests (`fusion.rs`) run against a stand-in
//! SandboxFusion server and need no bubblewrap; one of them also runs against a real server
//! where `ROLLFLASH_SANDBOX_FUSION_URL` is set.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod basics;
mod fusion;
mod hostile;
mod leaks;

use std::path::Path;

use rollflash_sandbox::{Execution, Program, Sandbox, SandboxConfig};
use tokio::sync::RwLock;

/// Tests take it shared; the leak test takes it alone, so no other sandbox runs while it
/// counts processes and files.
static EXCLUSIVE: RwLock<()> = RwLock::const_new(());

/// Small limits, so that the hostile cases end quickly.
pub fn test_config() -> SandboxConfig {
    SandboxConfig {
        workers: 2,
        wall_secs: 2.0,
        cpu_secs: 1,
        memory_mb: 256,
        processes: 16,
        output_bytes: 64 * 1024,
        tmpfs_mb: 8,
        ..SandboxConfig::default()
    }
}

/// The sandbox, or `None` (with the reason printed) where it cannot start.
pub async fn sandbox_with(config: SandboxConfig) -> Option<Sandbox> {
    match Sandbox::new(config).await {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

pub async fn sandbox() -> Option<Sandbox> {
    sandbox_with(test_config()).await
}

/// A marker unique to a test, passed as the program's argument so that it appears in the
/// command line of `bwrap` and of every process the program forks.
pub fn marker(test: &str) -> String {
    format!("rfsbx-marker-{test}-{}", std::process::id())
}

/// Runs `source` with the marker as its argument, then checks that no process carrying the
/// marker is left.
pub async fn run_marked(sb: &Sandbox, test: &str, program: Program) -> Execution {
    let m = marker(test);
    let e = sb.run(&program.with_args(vec![m.clone()])).await.unwrap();
    let left = processes_with(&m);
    assert!(
        left.is_empty(),
        "{test}: processes left behind: {left:?}\n{e:?}"
    );
    e
}

/// Processes (pid, command line) whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push((pid, cmdline));
        }
    }
    found
}

/// Children of this process (pids from `/proc/*/stat`).
pub fn children() -> Vec<u32> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces, so split after its last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(me) {
            found.push(pid);
        }
    }
    found
}

/// This repository's root `Cargo.toml`, by absolute path.
pub fn repo_manifest() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml")
}

/// An execution for a failure message: its output cut short, since some print megabytes.
pub fn brief(e: &Execution) -> String {
    let cut = |s: &str| s.chars().take(400).collect::<String>();
    format!(
        "{} (exit {:?}, {:?}); stdout: {:?}; stderr: {:?}",
        e.verdict,
        e.exit_code,
        e.wall,
        cut(&e.stdout),
        cut(&e.stderr)
    )
}
