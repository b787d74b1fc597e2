//! Tests of `latency`: the distributions, and the wrapper's delays and failures under paused
//! tokio time.

use std::time::Duration;

use async_trait::async_trait;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rollflash_env::latency::{FailureConfig, FailureKind, Flaky, LatencyConfig};
use rollflash_env::{Env, EnvError, Info, Reset, Step};
use tokio::time::Instant;

/// An environment that counts its steps and never ends: failures and delays are then the
/// wrapper's alone, and the count shows whether a failed call reached the environment.
#[derive(Debug, Default)]
struct Counter {
    steps: u64,
}

#[async_trait]
impl Env for Counter {
    async fn reset(&mut self, _seed: u64) -> Result<Reset, EnvError> {
        self.steps = 0;
        Ok(Reset {
            observation: "0".into(),
            info: Info::new(),
        })
    }

    async fn step(&mut self, _action: &str) -> Result<Step, EnvError> {
        self.steps += 1;
        Ok(Step {
            observation: self.steps.to_string(),
            ..Step::default()
        })
    }
}

fn samples(cfg: &LatencyConfig, n: usize, seed: u64) -> Vec<f64> {
    let sampler = cfg.sampler().expect("sampler");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| sampler.sample_secs(&mut rng)).collect()
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

#[test]
fn log_normal_is_parametrised_by_its_mean() {
    for (m, sigma) in [(0.5, 0.5), (2.0, 1.0), (0.05, 0.25)] {
        let cfg = LatencyConfig::LogNormal {
            mean: m,
            sigma,
            cap_secs: None,
        };
        let xs = samples(&cfg, 20_000, 7);
        let got = mean(&xs);
        assert!(
            (got - m).abs() / m < 0.03,
            "mean {m}, sigma {sigma}: sample mean {got}"
        );
        // The median of a log-normal is exp(mu) = mean * exp(-sigma^2 / 2).
        let mut sorted = xs.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let want = m * (-sigma * sigma / 2.0f64).exp();
        assert!(
            (median - want).abs() / want < 0.03,
            "median {median} vs {want}"
        );
        assert!(xs.iter().all(|&x| x > 0.0));
    }
}

#[test]
fn cap_fixed_and_uniform() {
    let capped = LatencyConfig::LogNormal {
        mean: 1.0,
        sigma: 2.0,
        cap_secs: Some(3.0),
    };
    let xs = samples(&capped, 5_000, 1);
    assert!(xs.iter().all(|&x| x <= 3.0));
    assert!(xs.contains(&3.0), "a heavy tail must hit the cap");

    assert!(samples(&LatencyConfig::Fixed { secs: 0.25 }, 100, 2)
        .iter()
        .all(|&x| x == 0.25));

    let xs = samples(
        &LatencyConfig::Uniform {
            low: 1.0,
            high: 3.0,
        },
        20_000,
        3,
    );
    assert!(xs.iter().all(|&x| (1.0..=3.0).contains(&x)));
    assert!((mean(&xs) - 2.0).abs() < 0.02);
    let point = samples(
        &LatencyConfig::Uniform {
            low: 1.0,
            high: 1.0,
        },
        10,
        3,
    );
    assert!(point.iter().all(|&x| x == 1.0));
}

#[test]
fn invalid_configs_name_the_field() {
    let field = |cfg: LatencyConfig| match cfg.sampler() {
        Err(EnvError::Config { field, .. }) => field,
        other => panic!("expected a config error, got {other:?}"),
    };
    assert_eq!(field(LatencyConfig::Fixed { secs: -1.0 }), "secs");
    assert_eq!(field(LatencyConfig::Fixed { secs: f64::NAN }), "secs");
    assert_eq!(
        field(LatencyConfig::Uniform {
            low: 2.0,
            high: 1.0
        }),
        "high"
    );
    let ln = |mean, sigma, cap_secs| LatencyConfig::LogNormal {
        mean,
        sigma,
        cap_secs,
    };
    assert_eq!(field(ln(0.0, 1.0, None)), "mean");
    assert_eq!(field(ln(1.0, -1.0, None)), "sigma");
    assert_eq!(field(ln(1.0, 11.0, None)), "sigma");
    assert_eq!(field(ln(1.0, 1.0, Some(-2.0))), "cap_secs");
    let bad_rate = FailureConfig {
        rate: 1.5,
        kind: FailureKind::Error,
    };
    assert!(matches!(
        Flaky::new(Counter::default(), None, Some(bad_rate), 0),
        Err(EnvError::Config { field, .. }) if field == "rate"
    ));
}

#[test]
fn configs_parse_from_json() {
    let l: LatencyConfig =
        serde_json::from_str(r#"{"kind": "log_normal", "mean": 0.5, "sigma": 1}"#).expect("l");
    assert_eq!(
        l,
        LatencyConfig::LogNormal {
            mean: 0.5,
            sigma: 1.0,
            cap_secs: None
        }
    );
    let f: FailureConfig = serde_json::from_str(r#"{"rate": 0.1}"#).expect("f");
    assert_eq!(f.kind, FailureKind::Error);
    let f: FailureConfig = serde_json::from_str(r#"{"rate": 0.1, "kind": "garbage"}"#).expect("f");
    assert_eq!(f.kind, FailureKind::Garbage);
    assert!(serde_json::from_str::<FailureConfig>(r#"{"rate": 0.1, "kind": "boom"}"#).is_err());
}

#[tokio::test(start_paused = true)]
async fn wrapper_sleeps_for_the_sampled_latency() {
    let cfg = LatencyConfig::LogNormal {
        mean: 0.3,
        sigma: 1.0,
        cap_secs: Some(10.0),
    };
    let seed = 99;
    // Without failure injection the wrapper draws one latency per call from its own RNG, so
    // the same sampler and seed predict every delay.
    let expected = samples(&cfg, 50, seed);
    let mut env = Flaky::new(Counter::default(), Some(cfg), None, seed).expect("flaky");
    for (i, want) in expected.iter().enumerate() {
        let start = Instant::now();
        if i == 0 {
            env.reset(0).await.expect("reset");
        } else {
            env.step("x").await.expect("step");
        }
        let got = start.elapsed().as_secs_f64();
        // Paused time jumps to the timer's deadline, which tokio rounds up to the millisecond.
        assert!(
            got >= want - 1e-9 && got < want + 0.002,
            "call {i}: slept {got}, sampled {want}"
        );
    }
    assert_eq!(env.inner().steps, 49);
}

#[tokio::test(start_paused = true)]
async fn failure_rate_matches_and_errors_skip_the_env() {
    let failure = FailureConfig {
        rate: 0.2,
        kind: FailureKind::Error,
    };
    let mut env = Flaky::new(Counter::default(), None, Some(failure), 5).expect("flaky");
    let n = 10_000;
    let mut failed = 0;
    for _ in 0..n {
        match env.step("x").await {
            Ok(_) => {}
            Err(EnvError::Failed(m)) => {
                assert!(m.contains("injected"));
                failed += 1;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    let rate = failed as f64 / n as f64;
    assert!((rate - 0.2).abs() < 0.015, "failure rate {rate}");
    assert_eq!(
        env.inner().steps,
        (n - failed) as u64,
        "failed calls never reach the env"
    );
}

#[tokio::test(start_paused = true)]
async fn garbage_runs_the_env_then_loses_the_reply() {
    let failure = FailureConfig {
        rate: 0.5,
        kind: FailureKind::Garbage,
    };
    let mut env = Flaky::new(Counter::default(), None, Some(failure), 8).expect("flaky");
    let mut garbage = 0;
    for _ in 0..1_000 {
        match env.step("x").await {
            Ok(_) => {}
            Err(EnvError::Garbage(_)) => garbage += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert!((400..600).contains(&garbage), "{garbage}");
    assert_eq!(env.inner().steps, 1_000, "garbage calls did reach the env");
}

#[tokio::test(start_paused = true)]
async fn hang_never_returns_before_the_timeout() {
    let failure = FailureConfig {
        rate: 1.0,
        kind: FailureKind::Hang,
    };
    let latency = LatencyConfig::Fixed { secs: 0.5 };
    let mut env = Flaky::new(Counter::default(), Some(latency), Some(failure), 1).expect("flaky");
    for limit in [1u64, 60, 86_400 * 7] {
        let start = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(limit), env.step("x")).await;
        assert!(r.is_err(), "returned before the {limit}s timeout");
        assert_eq!(start.elapsed(), Duration::from_secs(limit));
    }
    assert!(tokio::time::timeout(Duration::from_secs(10), env.reset(0))
        .await
        .is_err());
    assert_eq!(env.inner().steps, 0, "a hung call never reached the env");
}

#[tokio::test(start_paused = true)]
async fn same_seed_same_noise() {
    let run = |seed| async move {
        let mut env = Flaky::new(
            Counter::default(),
            Some(LatencyConfig::Uniform {
                low: 0.0,
                high: 1.0,
            }),
            Some(FailureConfig {
                rate: 0.3,
                kind: FailureKind::Error,
            }),
            seed,
        )
        .expect("flaky");
        let start = Instant::now();
        let mut outcomes = Vec::new();
        for _ in 0..100 {
            outcomes.push(env.step("x").await.is_ok());
        }
        (outcomes, start.elapsed())
    };
    let a = run(4).await;
    assert_eq!(a, run(4).await);
    assert_ne!(a, run(5).await);
}
