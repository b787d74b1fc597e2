//! Ctrl-C / SIGTERM on `rollflash train` as a real process: the run stops cleanly, reports
//! its sample counts (which add up, with nothing left running), writes a checkpoint of where
//! it stopped even with periodic checkpoints off, exits with 130, and `--resume` continues
//! from that checkpoint.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A run that would take hours: random built-in model on FrozenLake, asynchronous (α = 1),
/// no warm-up, no evaluation, no periodic checkpoints.
fn args(dir: &Path, steps: usize, warmup_steps: usize) -> Vec<String> {
    let mut sets = crate::tiny_run::tiny_lake_sets(dir);
    sets.extend([
        "seed=5".into(),
        format!("warmup.steps={warmup_steps}"),
        "buffer.alpha=1".into(),
        format!("train.steps={steps}"),
        "checkpoint.every=0".into(),
    ]);
    let mut a = vec!["train".to_string()];
    for s in sets {
        a.push("--set".into());
        a.push(s);
    }
    a
}

fn spawn(dir: &Path, extra: &[&str], steps: usize, warmup_steps: usize) -> Child {
    let out = std::fs::File::create(dir.join(format!("stdout-{}.txt", extra.len()))).unwrap();
    let err = std::fs::File::create(dir.join(format!("stderr-{}.txt", extra.len()))).unwrap();
    Command::new(env!("CARGO_BIN_EXE_rollflash"))
        .args(args(dir, steps, warmup_steps))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap()
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// Polls until `cond` holds (the process is real, so this is wall-clock), at most `limit`.
fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("did not exit within {limit:?} of the signal");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The numbers of the `samples:` line, in order: started, trained, filtered, dropped-stale,
/// aborted, failed, running, buffered.
fn counts(stdout: &str) -> Vec<u64> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("samples: started"))
        .unwrap_or_else(|| panic!("no samples line in {stdout}"));
    line.split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
}

fn metric_lines(dir: &Path) -> usize {
    read(dir, "metrics.jsonl").lines().count()
}

#[test]
fn sigint_mid_run_stops_cleanly_accounts_for_everything_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut child = spawn(dir, &[], 100_000, 0);
    wait_for("two published steps", Duration::from_secs(300), || {
        metric_lines(dir) >= 2
    });
    signal(&child, "-INT");
    let status = wait_exit(&mut child, Duration::from_secs(120));
    let stdout = read(dir, "stdout-0.txt");
    let stderr = read(dir, "stderr-0.txt");
    assert_eq!(status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(stderr.contains("stopping:"), "{stderr}");
    assert!(stdout.contains("interrupted after"), "{stdout}");

    let c = counts(&stdout);
    assert_eq!(c.len(), 8, "{c:?}");
    assert_eq!(c[0], c[1..6].iter().sum::<u64>(), "counts add up: {c:?}");
    assert_eq!(
        (c[6], c[7]),
        (0, 0),
        "nothing left running or buffered: {c:?}"
    );
    assert!(c[1] >= 2 * 8, "two steps trained: {c:?}");

    // The stop's checkpoint, though `checkpoint.every = 0`; its step count is the metrics'.
    let steps_done = metric_lines(dir);
    let ckpt = rollflash_run::checkpoint::latest(&rollflash_run::checkpoint::root(dir)).unwrap();
    assert_eq!(
        ckpt,
        rollflash_run::checkpoint::step_dir(&rollflash_run::checkpoint::root(dir), steps_done)
    );
    assert!(read(dir, "report/report.md").contains("Interrupted"));

    // `--resume` continues there, to one more step.
    let mut resumed = spawn(dir, &["--resume"], steps_done + 1, 0);
    let status = wait_exit(&mut resumed, Duration::from_secs(300));
    let stdout = read(dir, "stdout-1.txt");
    assert!(status.success(), "{stdout}\n{}", read(dir, "stderr-1.txt"));
    assert!(stdout.contains(&format!("step {steps_done},")), "{stdout}");
    assert_eq!(metric_lines(dir), steps_done + 1);
}

#[test]
fn sigterm_during_the_warm_up_exits_at_once_and_saves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut child = spawn(dir, &[], 10, 100_000);
    wait_for("the warm-up to start", Duration::from_secs(120), || {
        read(dir, "stdout-0.txt").contains("warm-up step")
    });
    signal(&child, "-TERM");
    let status = wait_exit(&mut child, Duration::from_secs(60));
    let stdout = read(dir, "stdout-0.txt");
    assert_eq!(status.code(), Some(130), "{stdout}");
    assert!(
        stdout.contains("interrupted during the warm-up"),
        "{stdout}"
    );
    assert!(!rollflash_run::checkpoint::root(dir).exists());
}
