//! The warm-up cache as a user meets it: shared by runs whatever their `output_dir`, reused
//! only when this build's arithmetic made it, and written whole or not at all.

use std::path::Path;
use std::process::Command;

fn train(dir: &Path, out: &str, cache: &Path) -> String {
    let sets = [
        format!("output_dir={:?}", dir.join(out).display().to_string()),
        format!("warmup.cache_dir={:?}", cache.display().to_string()),
        "warmup.steps=3".into(),
        "warmup.batch_size=4".into(),
        "train.steps=1".into(),
        "train.eval_problems=0".into(),
        "buffer.groups_per_batch=1".into(),
        "buffer.group_size=2".into(),
        "rollout.max_new_tokens=4".into(),
        "metrics.progress=false".into(),
    ];
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollflash"));
    cmd.arg("train");
    for s in &sets {
        cmd.args(["--set", s]);
    }
    let o = cmd.current_dir(dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "stdout {stdout}\nstderr {}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

#[test]
fn a_warmup_is_shared_by_runs_and_redone_for_another_builds_arithmetic() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let first = train(dir.path(), "a", &cache);
    assert!(first.contains("warm-up: 3 supervised steps"), "{first}");
    let entries: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        entries.len(),
        1,
        "one result, no temporary left: {entries:?}"
    );
    let result = cache.join(&entries[0]);
    assert!(entries[0].starts_with("warmup-"), "{entries:?}");
    let fingerprint = std::fs::read_to_string(result.join("numerics-fingerprint.txt")).unwrap();
    assert_eq!(fingerprint.trim().len(), 16, "{fingerprint:?}");

    // Another output directory, the same settings: reused, not redone.
    let second = train(dir.path(), "b", &cache);
    assert!(second.contains("warm-up: reused"), "{second}");
    assert!(!second.contains("supervised steps"), "{second}");
    // The fingerprint is a property of the build: the reuse saw the same one.
    assert_eq!(
        std::fs::read_to_string(result.join("numerics-fingerprint.txt")).unwrap(),
        fingerprint
    );

    // A result another build made (its arithmetic differs) is not reused: redone, replaced.
    std::fs::write(
        result.join("numerics-fingerprint.txt"),
        "0123456789abcdef\n",
    )
    .unwrap();
    let third = train(dir.path(), "c", &cache);
    assert!(third.contains("warm-up: 3 supervised steps"), "{third}");
    assert!(third.contains("warm-up: replaced"), "{third}");
    assert_eq!(
        std::fs::read_to_string(result.join("numerics-fingerprint.txt")).unwrap(),
        fingerprint,
        "the replacement is this build's"
    );
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
}
