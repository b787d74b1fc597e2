//! Tests of `math_task`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rollflash_env::dataset::Dataset;
use rollflash_env::math_task::{
    MathDataset, MathEnv, MathTask, MathTaskConfig, Operator, MAX_EXAMPLE_CHARS,
};
use rollflash_env::verify::expr::{evaluate, Grammar, Number, Rational};
use rollflash_env::verify::{MathVerifier, Verifier};
use rollflash_env::{Env, EnvError, OutOfOrder};

fn task(cfg: MathTaskConfig) -> MathTask {
    MathTask::new(cfg).unwrap()
}

/// Configurations covering every operator and the length limits.
fn configs() -> Vec<MathTaskConfig> {
    let d = MathTaskConfig::default();
    vec![
        d.clone(),
        MathTaskConfig {
            operators: vec![Operator::Add, Operator::Sub],
            seed: 5,
            ..d.clone()
        },
        MathTaskConfig {
            operators: vec![Operator::Add, Operator::Sub, Operator::Mul],
            max_terms: 10,
            product_prob: 0.5,
            ..d.clone()
        },
        MathTaskConfig {
            max_digits: 4,
            max_terms: 12,
            operators: vec![Operator::Sub],
            tail_exponent: 0.0,
            ..d
        },
    ]
}

/// Checks one worked solution step by step: every `a op b=c` is right, the products come
/// first, the last running total is the `####` answer, and the prompt's expression evaluates
/// to it.
fn check_solution(prompt: &str, solution: &str, answer: &str) {
    let expr = prompt
        .strip_prefix("Q: ")
        .and_then(|p| p.strip_suffix("\nA: "))
        .unwrap_or_else(|| panic!("prompt format: {prompt:?}"));
    let value = evaluate(expr, Grammar::MATH).unwrap().value;
    assert_eq!(
        value,
        Number::Exact(Rational::int(answer.parse().unwrap())),
        "{prompt:?}"
    );
    let (steps, final_answer) = solution.split_once(" #### ").unwrap();
    assert_eq!(final_answer, answer);
    for step in steps.split(' ') {
        let (lhs, rhs) = step.split_once('=').unwrap();
        let want: i128 = rhs.parse().unwrap();
        assert_eq!(
            evaluate(lhs, Grammar::MATH).unwrap().value,
            Number::Exact(Rational::int(want)),
            "step {step:?} of {solution:?}"
        );
    }
}

#[test]
fn problems_are_deterministic_by_seed() {
    let t = task(MathTaskConfig::default());
    for seed in 0..50 {
        assert_eq!(t.problem(seed), t.problem(seed));
    }
    let distinct: std::collections::HashSet<String> =
        (0..50).map(|s| t.problem(s).prompt).collect();
    assert!(distinct.len() > 45, "seeds give different problems");
    let other = task(MathTaskConfig {
        seed: 1,
        ..Default::default()
    });
    assert_ne!(t.problem(0), other.problem(0), "the config seed matters");
    // Pinned: the generator is part of an experiment's definition; changing it must be
    // deliberate.
    let p = t.problem(0);
    assert_eq!(p.prompt, "Q: 33+38+60\nA: ");
    assert_eq!(p.solution, "33+38=71 71+60=131 #### 131");
    assert_eq!((p.answer.as_str(), p.terms), ("131", 3));
}

#[test]
fn solution_lengths_have_a_long_tail() {
    let t = task(MathTaskConfig::default());
    let mut lens: Vec<usize> = (0..2000).map(|s| t.problem(s).solution.len()).collect();
    lens.sort_unstable();
    let median = lens[lens.len() / 2];
    let p95 = lens[lens.len() * 95 / 100];
    assert!(
        p95 >= 3 * median,
        "95th percentile {p95} < 3 x median {median}"
    );
    let mut terms: Vec<usize> = (0..2000).map(|s| t.problem(s).terms).collect();
    terms.sort_unstable();
    let two = terms.iter().filter(|n| **n == 2).count();
    assert!(terms[1000] <= 3, "most problems are short");
    assert!(two >= 800, "{two} of 2000 problems have two terms");
    assert!(terms[1999] >= 20, "the tail reaches long problems");
}

#[test]
fn every_solution_is_correct_and_verifies() {
    let strict = MathVerifier::strict();
    for cfg in configs() {
        let t = task(cfg.clone());
        for seed in 0..500 {
            let p = t.problem(seed);
            check_solution(&p.prompt, &p.solution, &p.answer);
            let r = strict.score(&p.solution, &p.answer);
            assert_eq!(r.value, 1.0, "{cfg:?} seed {seed}: {}", r.detail);
            assert_eq!(t.score(&p.solution, &p.answer), 1.0);
            // The wrong answer is refused.
            let wrong = format!(
                "{} #### {}",
                p.solution,
                p.answer.parse::<i64>().unwrap() + 1
            );
            assert_eq!(strict.score(&wrong, &p.answer).value, 0.0);
        }
    }
}

#[test]
fn warmup_examples_are_ascii_and_fit_the_context() {
    let mut longest = 0;
    for cfg in configs() {
        let t = task(cfg.clone());
        let bound = cfg.max_example_chars();
        assert!(bound <= MAX_EXAMPLE_CHARS);
        let examples = t.warmup_examples(1000, 9);
        assert_eq!(examples, t.warmup_examples(1000, 9));
        for (prompt, completion) in &examples {
            let printable = |s: &str| s.bytes().all(|b| (32..=126).contains(&b));
            assert!(printable(completion), "{completion:?}");
            assert!(printable(&prompt.replace('\n', "")), "{prompt:?}");
            assert_eq!(prompt.matches('\n').count(), 1);
            let n = prompt.len() + completion.len();
            assert!(n <= bound, "{n} > bound {bound}: {prompt:?}{completion:?}");
            longest = longest.max(n);
            check_solution(prompt, completion, completion.rsplit(' ').next().unwrap());
        }
        // Warm-up problems come from their own stream, not the environment's.
        assert_ne!(examples[0].0, t.problem(0).prompt);
    }
    assert!(longest > 100, "the tail is exercised (longest {longest})");
}

#[test]
fn config_validation_names_the_field() {
    let d = MathTaskConfig::default;
    let cases = [
        (
            MathTaskConfig {
                min_terms: 1,
                ..d()
            },
            "min_terms",
        ),
        (
            MathTaskConfig {
                min_terms: 5,
                max_terms: 4,
                ..d()
            },
            "max_terms",
        ),
        (
            MathTaskConfig {
                tail_exponent: f64::NAN,
                ..d()
            },
            "tail_exponent",
        ),
        (
            MathTaskConfig {
                tail_exponent: -1.0,
                ..d()
            },
            "tail_exponent",
        ),
        (
            MathTaskConfig {
                max_digits: 0,
                ..d()
            },
            "max_digits",
        ),
        (
            MathTaskConfig {
                max_digits: 7,
                ..d()
            },
            "max_digits",
        ),
        (
            MathTaskConfig {
                operators: vec![],
                ..d()
            },
            "operators",
        ),
        (
            MathTaskConfig {
                operators: vec![Operator::Mul],
                ..d()
            },
            "operators",
        ),
        (
            MathTaskConfig {
                product_prob: 1.5,
                ..d()
            },
            "product_prob",
        ),
        (
            MathTaskConfig {
                max_terms: 100,
                ..d()
            },
            "max_terms",
        ),
        (
            MathTaskConfig {
                operators: vec![Operator::Add, Operator::Mul],
                ..d()
            },
            "max_terms",
        ),
    ];
    for (cfg, field) in cases {
        let e = cfg.validate().unwrap_err();
        assert_eq!(e.field, field, "{cfg:?}: {e}");
        match MathEnv::new(cfg) {
            Err(EnvError::Config { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected a config error, got {other:?}"),
        }
    }
}

#[test]
fn config_serde() {
    let c: MathTaskConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(c, MathTaskConfig::default());
    let c: MathTaskConfig =
        serde_json::from_str(r#"{"operators": ["+", "-", "*"], "max_terms": 8}"#).unwrap();
    assert_eq!(c.operators, [Operator::Add, Operator::Sub, Operator::Mul]);
    c.validate().unwrap();
    assert!(serde_json::from_str::<MathTaskConfig>(r#"{"terms": 3}"#).is_err());
    assert!(serde_json::from_str::<MathTaskConfig>(r#"{"operators": ["/"]}"#).is_err());
    let back: MathTaskConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn dataset_adapter() {
    let t = task(MathTaskConfig::default());
    let ds: MathDataset = t.dataset(100, 3);
    assert_eq!(ds.len(), 100);
    assert!(ds.get(100).is_none());
    let r = ds.get(7).unwrap();
    assert_eq!(r, ds.get(7).unwrap());
    let solution = r.extra["solution"].as_str().unwrap();
    assert_eq!(MathVerifier::strict().score(solution, &r.answer).value, 1.0);
    assert_ne!(
        t.dataset(100, 4).get(7).unwrap(),
        r,
        "the dataset seed matters"
    );
    let boxed: Box<dyn Dataset> = Box::new(ds);
    assert_eq!(boxed.len(), 100);
}

#[tokio::test]
async fn math_env_episode() {
    let mut env = MathEnv::new(MathTaskConfig::default()).unwrap();
    match env.step("1").await {
        Err(e @ EnvError::OutOfOrder(OutOfOrder::StepBeforeReset { .. })) => {
            assert_eq!(
                e.to_string(),
                "environment used out of order: math: step before reset"
            )
        }
        other => panic!("expected step before reset, got {other:?}"),
    }
    let p = env.task().problem(11);
    let reset = env.reset(11).await.unwrap();
    assert_eq!(reset.observation, p.prompt);
    let step = env.step(&p.solution).await.unwrap();
    assert_eq!(step.reward, 1.0);
    assert!(step.terminated && !step.truncated && step.done());
    assert!(matches!(
        env.step(&p.solution).await,
        Err(EnvError::OutOfOrder(OutOfOrder::StepAfterEnd { .. }))
    ));
    env.reset(12).await.unwrap();
    let step = env.step("I do not know #### 123456789").await.unwrap();
    assert_eq!(step.reward, 0.0);
    assert!(step.terminated);
    // Strict: a bare number without the `####` marker earns nothing.
    let p = env.task().problem(13);
    env.reset(13).await.unwrap();
    assert_eq!(env.step(&p.answer).await.unwrap().reward, 0.0);
}
