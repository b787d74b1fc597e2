//! The run plan and a Python reward: `[reward.python]` is validated naming its field, and
//! the plan keeps it only when the in-process dataset task's reward is a Python function.

use rollflash_run::config::TrainConfig;
use rollflash_run::plan::RunPlan;

fn dataset_sets(dir: &std::path::Path, reward: Option<&str>) -> Vec<String> {
    let data = dir.join("train.jsonl");
    std::fs::write(&data, "{\"q\": \"1+1\", \"a\": \"#### 2\"}\n").unwrap();
    let scorer = dir.join("r.py");
    std::fs::write(&scorer, "def compute_score(*a):\n    return 1.0\n").unwrap();
    let mut s = vec![
        "env.name=dataset".to_string(),
        format!("env.files=[{{path={:?}}}]", data.display().to_string()),
        "env.prompt=q".into(),
        "env.answer=a".into(),
        "train.eval_problems=0".into(),
    ];
    if let Some(r) = reward {
        s.push(r.replace("SCORER", &format!("{:?}", scorer.display().to_string())));
    }
    s
}

#[test]
fn reward_python_settings_are_checked_naming_the_field() {
    let e = TrainConfig::load(None, &["reward.python.workers=0".into()]).unwrap_err();
    assert!(e.to_string().contains("reward.python.workers"), "{e}");
    let e = TrainConfig::load(None, &["reward.python.timeout_secs=-1".into()]).unwrap_err();
    assert!(e.to_string().contains("reward.python.timeout_secs"), "{e}");
    let e = TrainConfig::load(None, &["reward.python.nope=1".into()]).unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
}

#[test]
fn the_plan_keeps_the_pool_only_for_a_python_reward() {
    let dir = tempfile::tempdir().unwrap();
    let with = dataset_sets(
        dir.path(),
        Some("env.reward={python={path=SCORER, style=\"verl\"}}"),
    );
    let mut sets = with.clone();
    sets.push("reward.python.workers=3".into());
    let plan = RunPlan::new(TrainConfig::load(None, &sets).unwrap()).unwrap();
    assert_eq!(plan.python_reward().map(|p| p.workers), Some(3));
    let plan =
        RunPlan::new(TrainConfig::load(None, &dataset_sets(dir.path(), None)).unwrap()).unwrap();
    assert!(plan.python_reward().is_none());
    // A reward file that is not there stops the config load, naming the field.
    let e = TrainConfig::load(
        None,
        &dataset_sets(
            dir.path(),
            Some("env.reward={python={path=\"missing.py\"}}"),
        ),
    )
    .unwrap_err();
    // What a user reads: the message and its causes.
    let e = rollflash_core::error_chain(&e);
    assert!(
        e.contains("reward.python.path") && e.contains("missing.py"),
        "{e}"
    );
}
