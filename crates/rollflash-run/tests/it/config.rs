//! `rollflash train`'s configuration: defaults, overrides, round trips, and errors that name
//! the field.

use rollflash_run::config::TrainConfig;

use crate::ChainText;

fn load(sets: &[&str]) -> Result<TrainConfig, String> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    TrainConfig::load(None, &sets).map_err(|e| rollflash_core::error_chain(&e))
}

#[test]
fn the_default_is_complete_and_valid() {
    let c = load(&[]).unwrap();
    assert_eq!(c, TrainConfig::default());
    assert_eq!(c.buffer.alpha, 1.0);
    assert_eq!(c.env.name(), "math");
}

#[test]
fn dry_run_output_parses_back_to_the_same_config() {
    let c = load(&[
        "buffer.alpha=2",
        "rollout.routing=sticky",
        "env.name=frozen_lake",
    ])
    .unwrap();
    let text = c.to_toml().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, &text).unwrap();
    let back = TrainConfig::load(Some(&p), &[]).unwrap();
    assert_eq!(back, c);
    assert_eq!(back.buffer.alpha, 2.0);
    assert_eq!(back.rollout.routing, rollflash_core::proxy::Routing::Sticky);
}

#[test]
fn overrides_apply_over_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, "seed = 5\n[train]\nsteps = 7\n").unwrap();
    let c = TrainConfig::load(Some(&p), &["train.steps=9".to_string()]).unwrap();
    assert_eq!((c.seed, c.train.steps), (5, 9));
}

#[test]
fn errors_name_the_field() {
    for (sets, needle) in [
        (vec!["train.stpes=3"], "stpes"),
        (vec!["buffer.alpha=-1"], "alpha"),
        (vec!["train.steps=\"many\""], "steps"),
        (vec!["rollout.routing=fastest"], "rollout.routing"),
        (vec!["rollout.engines=0"], "rollout.engines"),
        (vec!["controller.sync=true"], "alpha"),
        (vec!["buffer.group_size=0"], "group_size"),
        (vec!["env.name=chess"], "chess"),
        (vec!["nokey"], "key=value"),
        (vec!["rollout.renderer=\"html\""], "rollout.renderer"),
        (vec!["model.device=\"tpu\""], "model.device"),
        (vec!["model.dtype=\"bf16\""], "model.dtype"),
        (vec!["metrics.prometheus=\"here\""], "metrics.prometheus"),
        (
            vec!["controller.serve_timeout_secs=0"],
            "serve_timeout_secs",
        ),
        (
            vec!["rollout.request_timeout_secs=-1"],
            "request_timeout_secs",
        ),
    ] {
        let e = load(&sets).unwrap_err();
        assert!(e.contains(needle), "{sets:?}: {e}");
    }
}

#[test]
fn a_missing_config_file_is_named() {
    let e = TrainConfig::load(Some(std::path::Path::new("/nonexistent/c.toml")), &[])
        .unwrap_err()
        .chain_text();
    assert!(e.contains("/nonexistent/c.toml"), "{e}");
}

/// A section tagged by `name` that names another variant replaces the default's section
/// instead of merging into it (GRPO's `norm_by_std` is no field of REINFORCE++), from
/// `--set` and from a file alike; naming the same variant still merges.
#[test]
fn switching_the_advantage_estimator_drops_the_defaults_fields() {
    use rollflash_train::advantage::AdvantageEstimator;
    let c = load(&["train.advantage={ name = \"reinforce_plus_plus\", kl_coef = 0.01 }"]).unwrap();
    assert!(matches!(
        c.train.advantage,
        AdvantageEstimator::ReinforcePlusPlus { kl_coef, .. } if kl_coef == 0.01
    ));
    let c = load(&["train.advantage.name=\"rloo\""]).unwrap();
    assert!(matches!(c.train.advantage, AdvantageEstimator::Rloo));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(
        &p,
        "[train.advantage]\nname = \"reinforce_plus_plus\"\nbaseline = true\n",
    )
    .unwrap();
    let c = TrainConfig::load(Some(&p), &[]).unwrap();
    assert!(matches!(
        c.train.advantage,
        AdvantageEstimator::ReinforcePlusPlus { baseline: true, .. }
    ));
    let c = load(&["train.advantage.norm_by_std=false"]).unwrap();
    assert!(matches!(
        c.train.advantage,
        AdvantageEstimator::Grpo {
            norm_by_std: false,
            ..
        }
    ));
}

/// The plan derives each rule once: the synchronous baseline's buffer, the backends, the task
/// seed rule, the warm-up cache, the device.
#[test]
fn the_plan_derives_every_rule_from_the_config() {
    use rollflash_run::plan::{task_seed, BackendPlan, RunPlan, WarmupPlan};
    let cfg = TrainConfig::load(
        None,
        &[
            "seed=7",
            "controller.sync=true",
            "buffer.alpha=0",
            "rollout.engines=3",
            "rollout.engine_threads=2",
            "rollout.routing=\"sticky\"",
        ]
        .map(String::from),
    )
    .unwrap();
    let plan = RunPlan::new(cfg.clone()).unwrap();
    assert!(plan.sync() && plan.controller().core.buffer.barrier);
    assert_eq!(plan.alpha(), 0.0);
    assert_eq!(plan.controller().core.seed, task_seed(7));
    assert_eq!(
        task_seed(7),
        7 * 1_000_003,
        "the rule checkpoints and sim validate rely on"
    );
    assert_eq!(plan.backends().len(), 3);
    assert!(plan
        .backends()
        .iter()
        .all(|b| matches!(b, BackendPlan::Engine { threads: 2, .. })));
    assert_eq!(plan.routing(), rollflash_core::proxy::Routing::Sticky);
    assert!(plan.placement().device.is_cpu());
    assert_eq!(plan.learner().temperature, cfg.rollout.temperature);
    match plan.warmup() {
        WarmupPlan::Run { cache, .. } => {
            // One cache for every run of these settings, wherever its output goes.
            let mut elsewhere = cfg.clone();
            elsewhere.output_dir = "runs/elsewhere".into();
            let other = rollflash_run::plan::RunPlan::new(elsewhere).unwrap();
            assert_eq!(other.warmup_cache(), Some(cache));
            // `warmup.cache_dir` puts it where asked, under the same key.
            let mut pinned = cfg.clone();
            pinned.warmup.cache_dir = Some("/tmp/wu".into());
            let pinned = rollflash_run::plan::RunPlan::new(pinned).unwrap();
            let p = pinned.warmup_cache().unwrap();
            assert_eq!(p.parent().unwrap(), std::path::Path::new("/tmp/wu"));
            assert_eq!(p.file_name(), cache.file_name());
        }
        other => panic!("the math task warms up: {other:?}"),
    }
    assert!(plan.describe().iter().any(|l| l.contains("engine-2")));
}

/// Thread counts are `"auto"` by default and resolve to the machine's cores in the plan
/// (`rollflash_run::cores`); a pinned count is kept; anything else names the field.
#[test]
fn thread_counts_are_auto_by_default_and_pinned_when_written() {
    use rollflash_run::config::Threads;
    use rollflash_run::plan::{BackendPlan, RunPlan};
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let auto = load(&[]).unwrap();
    assert_eq!(auto.train.threads, Threads::Auto);
    assert_eq!(auto.rollout.engine_threads, Threads::Auto);
    let plan = RunPlan::new(auto).unwrap();
    assert_eq!(plan.learner().threads, cores);
    assert_eq!(plan.cores().engine_threads, cores);
    assert!(plan
        .describe()
        .iter()
        .any(|l| l.starts_with(&format!("cores: {cores} available"))));
    let pinned = load(&[
        "train.threads=3",
        "rollout.engine_threads=\"auto\"",
        "rollout.engines=2",
    ])
    .unwrap();
    assert_eq!(pinned.train.threads, Threads::Fixed(3));
    let plan = RunPlan::new(pinned.clone()).unwrap();
    assert_eq!(plan.learner().threads, 3);
    assert!(plan.backends().iter().all(
        |b| matches!(b, BackendPlan::Engine { threads, .. } if *threads == (cores / 2).max(1))
    ));
    // The written form round-trips: a number stays a number, auto stays auto.
    let text = pinned.to_toml().unwrap();
    assert!(text.contains("threads = 3") && text.contains("engine_threads = \"auto\""));
    for bad in [
        "train.threads=0",
        "train.threads=\"many\"",
        "rollout.engine_threads=-1",
    ] {
        let err = load(&[bad]).unwrap_err();
        let key = bad.split('=').next().unwrap();
        assert!(err.contains(key), "{bad}: {err}");
    }
}

/// `cuda:N` parses, and a build without the `cuda` feature refuses it by the field's name.
#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_in_a_build_without_it_is_refused_by_name() {
    let cfg = load(&["model.device=\"cuda:1\""]).unwrap();
    assert_eq!(cfg.model.device, rollflash_run::config::DeviceSpec::Cuda(1));
    let e = rollflash_run::plan::RunPlan::new(cfg)
        .unwrap_err()
        .chain_text();
    assert!(e.contains("model.device") && e.contains("cuda"), "{e}");
    // `--dry-run` says what this build can do.
    let plan = rollflash_run::plan::RunPlan::new(load(&[]).unwrap()).unwrap();
    assert!(
        plan.describe()[0].contains("without the `cuda` feature"),
        "{:?}",
        plan.describe()
    );
}

#[test]
fn remote_and_openenv_environments_load_validate_and_round_trip() {
    use rollflash_run::config::EnvSection;
    let dir = env!("CARGO_MANIFEST_DIR");
    let path = std::path::Path::new(dir).join("../../configs/frozenlake_remote.toml");
    let c = TrainConfig::load(Some(&path), &[]).unwrap();
    let EnvSection::Remote(r) = &c.env else {
        panic!("{:?}", c.env)
    };
    assert_eq!(r.url, "http://127.0.0.1:30001");
    assert_eq!(r.api_key_env.as_deref(), Some("ENV_KEY"));
    assert_eq!(c.env.name(), "frozen_lake");
    // The plan needs the key's variable: unset, it is named.
    let unset = format!("{}_UNSET_FOR_TEST", "ROLLFLASH");
    let c = TrainConfig::load(Some(&path), &[format!("env.remote.api_key_env={unset:?}")]).unwrap();
    let e = rollflash_run::plan::RunPlan::new(c)
        .unwrap_err()
        .chain_text();
    assert!(
        e.contains("env.remote.api_key_env") && e.contains(&unset),
        "{e}"
    );

    // `--set` switches a built-in env to a server whole, and back.
    let sets = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let c = TrainConfig::load(
        None,
        &sets(&[
            "env.openenv.url=\"http://127.0.0.1:8100\"",
            "env.openenv.action_field=guess",
        ]),
    )
    .unwrap();
    let EnvSection::OpenEnv(o) = &c.env else {
        panic!("{:?}", c.env)
    };
    assert_eq!(o.action_field.as_deref(), Some("guess"));
    assert_eq!(c.env.name(), "openenv");
    let plan = rollflash_run::plan::RunPlan::new(c.clone()).unwrap();
    assert!(
        plan.describe()
            .iter()
            .any(|l| l.contains("on OpenEnv http://127.0.0.1:8100")),
        "{:?}",
        plan.describe()
    );
    let back = TrainConfig::load(Some(&write_tmp(&c.to_toml().unwrap())), &[]).unwrap();
    assert_eq!(back, c, "the dry-run TOML loads back");

    // Errors name the field.
    for (set, field) in [
        (
            vec!["env.remote.url=\"ftp://x\"", "env.remote.spec.name=math"],
            "env.remote.url",
        ),
        (
            vec![
                "env.remote.url=\"http://h:1\"",
                "env.remote.spec.name=math",
                "env.remote.api_key=a",
                "env.remote.api_key_env=B",
            ],
            "env.remote.api_key_env",
        ),
        (
            vec![
                "env.remote.url=\"http://h:1\"",
                "env.remote.spec.name=math",
                "env.remote.timeout_secs=0",
            ],
            "env.remote.timeout_secs",
        ),
        (
            vec![
                "env.remote.url=\"http://h:1\"",
                "env.remote.spec.name=math",
                "env.remote.spec.max_terms=0",
            ],
            "env.remote.spec.math.",
        ),
        (vec!["env.openenv.url=\"https://h\""], "env.openenv.url"),
        (
            vec![
                "env.openenv.url=\"http://h:1\"",
                "env.openenv.timeout_secs=-1",
            ],
            "env.openenv.timeout_secs",
        ),
        (vec!["env.remote.url=\"http://h:1\""], "remote"),
        (
            vec!["env.openenv.url=\"http://h:1\"", "env.openenv.colour=1"],
            "openenv",
        ),
    ] {
        let e = TrainConfig::load(None, &sets(&set))
            .unwrap_err()
            .chain_text();
        assert!(e.contains(field), "{set:?}: {e}");
    }
    // A source key next to a built-in's fields is refused, saying where they belong.
    let e = TrainConfig::load(
        Some(&write_tmp(
            "[env]\nname = \"math\"\n[env.remote]\nurl = \"http://h:1\"\n",
        )),
        &[],
    )
    .unwrap_err()
    .chain_text();
    assert!(e.contains("remote.spec"), "{e}");
}

/// `text` in a file of its own under the system's temporary directory.
fn write_tmp(text: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let p = std::env::temp_dir().join(format!("rollflash-config-{}-{n}.toml", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

/// `[[rollout.servers]]`: what a wrong entry says (the field, with its index), that servers
/// may replace the engines, that the API key never reaches `--dry-run`'s output, and the
/// resolved fleet in the plan.
#[test]
fn rollout_servers_are_validated_by_field_and_planned_beside_the_engines() {
    use rollflash_run::plan::{BackendPlan, RunPlan};
    let dir = tempfile::tempdir().unwrap();
    let write = |body: &str| {
        let p = dir.path().join("f.toml");
        std::fs::write(&p, body).unwrap();
        TrainConfig::load(Some(&p), &[]).map_err(|e| rollflash_core::error_chain(&e))
    };
    let entry = |extra: &str| {
        format!("[rollout]\nengines = 0\n[[rollout.servers]]\nkind = \"rollflash\"\nurl = \"http://127.0.0.1:30000\"\n{extra}")
    };
    for (extra, needle) in [
        (
            "max_running_requests = 0",
            "rollout.servers[0].max_running_requests",
        ),
        ("timeout_secs = 0", "rollout.servers[0].timeout_secs"),
        (
            "weight_sync_timeout_secs = -1",
            "rollout.servers[0].weight_sync_timeout_secs",
        ),
        (
            "weight_sync_timeout_secs = 1e30",
            "rollout.servers[0].weight_sync_timeout_secs",
        ),
        (
            "api_key_env = \"ROLLFLASH_TEST_SURELY_UNSET_VAR\"",
            "rollout.servers[0].api_key_env",
        ),
        ("weights = \"tensor\"", "weights"),
        ("kind2 = 1", "kind2"),
    ] {
        let e = write(&entry(extra)).unwrap_err();
        assert!(e.contains(needle), "{extra}: {e}");
    }
    let e = write(&entry("").replace("http://127.0.0.1:30000", "https://x")).unwrap_err();
    assert!(e.contains("rollout.servers[0].url"), "{e}");
    let e = write(&entry("").replace("rollflash", "triton")).unwrap_err();
    assert!(e.contains("kind"), "{e}");
    let two = format!(
        "{}\n[[rollout.servers]]\nkind = \"sglang\"\nurl = \"http://127.0.0.1:30000\"\n",
        entry("")
    );
    assert!(write(&two).unwrap_err().contains("rollout.servers[1].url"));

    // Two engines and one server, an API key inline: planned as one fleet, key kept out of
    // the printed config.
    let c = write(
        "[rollout]\nengines = 2\n[[rollout.servers]]\nkind = \"openai\"\nurl = \"http://10.0.0.5:8000\"\n\
         api_key = \"sk-secret-123\"\nweights = \"none\"\n",
    )
    .unwrap();
    assert!(!c.to_toml().unwrap().contains("sk-secret-123"));
    assert!(!format!("{c:?}").contains("sk-secret-123"));
    let plan = RunPlan::new(c).unwrap();
    assert_eq!(plan.backends().len(), 3);
    assert!(
        matches!(&plan.backends()[2], BackendPlan::Remote { http, .. }
        if http.api_key.as_deref() == Some("sk-secret-123"))
    );
    assert_eq!(plan.weights_dir(), None, "no server loads from disk");
    let text = plan.describe().join("\n");
    assert!(
        text.contains("http://10.0.0.5:8000: OpenAI-compatible server"),
        "{text}"
    );
    assert!(text.contains("keeps its own weights"), "{text}");
    assert!(!text.contains("sk-secret-123"));

    // A disk server gets the default weights directory under output_dir, and the
    // fleet's weight-update deadline unless it has its own.
    let c = write(&entry("")).unwrap();
    let plan = RunPlan::new(c.clone()).unwrap();
    assert_eq!(plan.weights_dir(), Some(&c.output_dir.join("published")));
    assert!(
        matches!(&plan.backends()[0], BackendPlan::Remote { weight_sync_timeout, .. }
        if weight_sync_timeout.as_secs_f64() == c.rollout.weight_sync_timeout_secs)
    );
    let plan = RunPlan::new(write(&entry("weight_sync_timeout_secs = 900")).unwrap()).unwrap();
    assert!(
        matches!(&plan.backends()[0], BackendPlan::Remote { weight_sync_timeout, .. }
        if weight_sync_timeout.as_secs() == 900)
    );
    let text = plan.describe().join("\n");
    assert!(text.contains("a weight update within 900 s"), "{text}");
}

/// A run that scores code checks its step deadline against one execution's: a step must not
/// time out before its program does (the remote sandbox adds its network margin).
#[test]
fn a_step_deadline_shorter_than_a_code_execution_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("code.jsonl");
    std::fs::write(
        &data,
        "{\"prompt\": \"def f():\\n\", \"test\": \"def check(c):\\n    assert c() == 1\\n\", \"entry_point\": \"f\"}\n",
    )
    .unwrap();
    let files = format!("env.files=[{{ path = {:?} }}]", data.display().to_string());
    let code = [
        "env.name=\"dataset\"",
        "env.reward=\"code\"",
        "env.answer=\"test\"",
        files.as_str(),
    ];
    let with = |extra: &[&str]| {
        let sets: Vec<&str> = code.iter().copied().chain(extra.iter().copied()).collect();
        rollflash_run::plan::RunPlan::new(load(&sets).unwrap()).map(|_| ())
    };
    with(&[]).unwrap();
    let e = with(&["sandbox.wall_secs=40"]).unwrap_err().to_string();
    assert!(e.contains("rollout.step_timeout_secs"), "{e}");
    assert!(e.contains("40 s"), "{e}");
    with(&["sandbox.wall_secs=40", "rollout.step_timeout_secs=60"]).unwrap();
    // The remote sandbox's margin counts: 10 + 10 fits 30, 15 + 20 does not.
    let remote = [
        "sandbox.kind=\"sandbox_fusion\"",
        "sandbox.url=\"http://127.0.0.1:1\"",
    ];
    with(&remote).unwrap();
    let mut far = remote.to_vec();
    far.extend(["sandbox.wall_secs=15", "sandbox.remote_margin_secs=20"]);
    let e = with(&far).unwrap_err().to_string();
    assert!(e.contains("35 s"), "{e}");
    // The multi-turn coding environment: each attempt is a turn.
    let e = with(&["env.attempts=3", "rollout.max_turns=2"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rollout.max_turns"), "{e}");
    with(&["env.attempts=3", "rollout.max_turns=3"]).unwrap();
}
