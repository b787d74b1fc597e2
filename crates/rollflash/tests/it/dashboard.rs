//! The dashboard in a real browser: a short `rollflash train --dashboard` (the built-in
//! model on tiny FrozenLake episodes, 3 steps, a few seconds), its page loaded in headless
//! Chromium (Debian's, installed by `scripts/setup_chromium.sh`), which runs the page's
//! JavaScript and dumps the DOM: the curves have points, the timeline has bars for both
//! rollout and training, the inspector lists trajectories. A screenshot is saved under the
//! run directory (in the target dir, not committed). Skipped, saying so, when Chromium
//! cannot be installed. Also the size cap of `trajectories.jsonl` (no browser needed).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Chromium's path from the project's script, or why there is none.
fn chromium() -> Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/setup_chromium.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && !path.is_empty() {
        Ok(PathBuf::from(path))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Waits for `child` to exit, killing it past `limit`.
fn wait(child: &mut Child, what: &str, limit: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs headless Chromium on `url` with `args`; its stdout.
fn browse(chrome: &Path, dir: &Path, args: &[String], url: &str) -> String {
    let out_path = dir.join("chromium-stdout.html");
    let mut child = Command::new(chrome)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
            &format!("--user-data-dir={}", dir.join("chromium-profile").display()),
        ])
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = wait(&mut child, "chromium", Duration::from_secs(90));
    assert!(status.success(), "chromium failed: {status}");
    std::fs::read_to_string(&out_path).unwrap()
}

/// The number in `name="N"` of the dumped DOM.
fn attr(dom: &str, name: &str) -> u64 {
    let key = format!("{name}=\"");
    let at = dom
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in the page"));
    let rest = &dom[at + key.len()..];
    rest[..rest.find('"').unwrap()].parse().unwrap()
}

#[test]
fn the_live_dashboard_draws_curves_timeline_and_trajectories_in_chromium() {
    let chrome = match chromium() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("skipping the browser test: Chromium is not available ({why})");
            return;
        }
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut sets = crate::tiny_run::tiny_lake_sets(&dir);
    sets.extend([
        "warmup.steps=0".into(),
        "train.steps=3".into(),
        "metrics.report=false".into(),
    ]);
    let stdout = dir.join("stdout.txt");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollflash"));
    cmd.arg("train");
    for s in &sets {
        cmd.args(["--set", s]);
    }
    let mut run = cmd
        .args(["--dashboard", "127.0.0.1:0", "--dashboard-keep"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr.txt")).unwrap())
        .spawn()
        .unwrap();
    // The run's three steps, then the page stays up.
    let t = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&stdout).unwrap_or_default();
        if text.contains("the dashboard stays up") {
            break text;
        }
        if let Some(s) = run.try_wait().unwrap() {
            panic!("the run exited ({s}) before its dashboard was up: {text}");
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "the run took too long: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let url = text
        .lines()
        .find_map(|l| l.strip_prefix("dashboard: "))
        .expect("the dashboard's address")
        .trim()
        .to_string();

    let dom = browse(&chrome, &dir, &["--dump-dom".into()], &url);
    std::fs::write(dir.join("dom.html"), &dom).unwrap();
    assert!(!dom.contains("data-error"), "the page reported an error");
    assert!(attr(&dom, "data-updates") >= 1);
    assert!(attr(&dom, "data-curves") >= 5, "curves drawn");
    assert!(
        attr(&dom, "data-curve-points") >= 3 * 5,
        "points on the curves"
    );
    assert!(
        attr(&dom, "data-timeline-bars-train") >= 3,
        "a train bar per step"
    );
    assert!(
        attr(&dom, "data-timeline-bars-rollout") >= 1,
        "rollout bars"
    );
    assert!(
        attr(&dom, "data-timeline-bars-sync") >= 3,
        "a weight load per step"
    );
    assert!(
        attr(&dom, "data-trajectories") >= 1,
        "the inspector lists trajectories"
    );
    // Multi-turn: the inspector shows the environment's observations between turns.
    assert!(dom.contains("class=\"env\""), "no observation pieces");

    let shot = dir.join("dashboard.png");
    browse(
        &chrome,
        &dir,
        &[
            "--window-size=1400,2200".into(),
            format!("--screenshot={}", shot.display()),
        ],
        &url,
    );
    assert!(std::fs::metadata(&shot)
        .map(|m| m.len() > 10_000)
        .unwrap_or(false));
    eprintln!("dashboard screenshot: {}", shot.display());

    // Ctrl-C ends the kept dashboard and the process cleanly.
    let ok = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let status = wait(&mut run, "rollflash train", Duration::from_secs(30));
    assert!(status.success(), "exit {status}");
}

/// `dashboard.trajectories_max_mb` bounds `trajectories.jsonl`: once the file reaches the cap
/// (here 100 bytes, reached by the first step's lines), later steps save nothing and the log
/// says from which step. No browser needed.
#[test]
fn trajectories_stop_at_their_size_cap_and_the_log_says_so() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("trajectories-cap-run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut sets = crate::tiny_run::tiny_lake_sets(&dir);
    sets.extend([
        "warmup.steps=0".into(),
        "train.steps=3".into(),
        "metrics.report=false".into(),
        "dashboard.trajectories_max_mb=0.0001".into(),
    ]);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollflash"));
    cmd.arg("train");
    for s in &sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("trajectories.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!rows.is_empty(), "the first step's trajectories are saved");
    assert!(
        rows.iter().all(|r| r["step"] == 0),
        "steps after the cap saved nothing"
    );
    assert!(
        stderr.contains("trajectories not saved from step 1 on"),
        "{stderr}"
    );
    // Not a terminal: the log is plain text.
    assert!(!stderr.contains('\x1b'), "colour codes in a redirected log");
}
