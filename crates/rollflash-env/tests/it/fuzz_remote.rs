//! Fuzzing the request parsing of the environment server (`rollflash env-serve`) with
//! proptest: environment specs built from the real field names with values of every type,
//! episodes driven with arbitrary reset and step bodies, raw bytes on arbitrary routes and
//! methods. Whatever arrives, the server answers, never with a 5xx other than 503 (at
//! capacity), always with a JSON error naming the problem, and it still serves afterwards.
//!
//! `ROLLFLASH_FUZZ_CASES` raises the number of cases per target (default 256); every target
//! prints how many cases it ran and how long they took.

use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use rollflash_env::remote::{serve, EnvServerConfig, ErrorBody};
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

const SPEC_KEYS: &[&str] = &[
    "name",
    "map",
    "is_slippery",
    "success_rate",
    "reward_schedule",
    "max_steps",
    "invalid_action_penalty",
    "width",
    "height",
    "num_boxes",
    "floor_fraction",
    "max_solution_moves",
    "step_reward",
    "max_turns",
    "require_tool",
    "large_digits",
    "small_digits",
    "min_terms",
    "max_terms",
    "latency",
    "failure",
    "kind",
    "secs",
    "rate",
    "noise_seed",
    "seed",
    "action",
    "zzz_unknown",
];

const NAMES: &[&str] = &["math", "frozen_lake", "sokoban", "tool_use", "chess", ""];

fn cases() -> u32 {
    std::env::var("ROLLFLASH_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-3i64..40).prop_map(Value::from),
        prop::sample::select(vec![
            json!(u64::MAX),
            json!(-1),
            json!(1e300),
            json!(0.5),
            json!("4x4"),
            json!("8x8"),
            json!("random"),
        ]),
        prop::sample::select(NAMES).prop_map(Value::from),
        "\\PC{0,10}".prop_map(Value::String),
    ]
}

fn tree() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 20, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(SPEC_KEYS), inner), 0..6).prop_map(|kv| {
                let m: Map<String, Value> =
                    kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                Value::Object(m)
            }),
        ]
    })
}

/// A spec object: a name (mostly a real one) and random fields, but no latency (a fuzzed
/// latency of a day would only test the client's patience).
fn spec() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(NAMES),
        prop::collection::vec((prop::sample::select(SPEC_KEYS), leaf()), 0..5),
    )
        .prop_map(|(name, kv)| {
            let mut m: Map<String, Value> = kv
                .into_iter()
                .filter(|(k, _)| *k != "latency")
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            m.insert("name".into(), name.into());
            Value::Object(m)
        })
}

struct Server {
    url: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

fn start(rt: &tokio::runtime::Runtime) -> Server {
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel();
        let cfg = EnvServerConfig {
            max_envs: 64,
            body_limit: 16 * 1024,
            ..Default::default()
        };
        let task = tokio::spawn(serve(listener, cfg, async move {
            let _ = rx.await;
        }));
        Server {
            url,
            stop: Some(tx),
            task,
        }
    })
}

fn stop(rt: &tokio::runtime::Runtime, mut s: Server) {
    if let Some(tx) = s.stop.take() {
        let _ = tx.send(());
    }
    rt.block_on(s.task).unwrap().unwrap();
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Sends one request and checks the answer; returns status and body.
async fn send(
    c: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Vec<u8>,
) -> Result<(u16, String), String> {
    let what = format!(
        "{method} {url} {}",
        String::from_utf8_lossy(&body)
            .chars()
            .take(200)
            .collect::<String>()
    );
    let resp = c
        .request(method, &url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| format!("{what}: no answer: {e}"))?;
    let status = resp.status().as_u16();
    let text = resp
        .text()
        .await
        .map_err(|e| format!("{what}: body lost: {e}"))?;
    if status >= 500 && status != 503 {
        return Err(format!("{what}: {status} {text}"));
    }
    if status >= 400 {
        let e: ErrorBody = serde_json::from_str(&text)
            .map_err(|_| format!("{what}: {status} without a JSON error: {text}"))?;
        if e.error.message.is_empty() || e.error.kind.is_empty() {
            return Err(format!("{what}: {status} with an empty error: {text}"));
        }
    }
    Ok((status, text))
}

fn fuzz<S: Strategy>(
    name: &str,
    strategy: S,
    case: impl Fn(&tokio::runtime::Runtime, &reqwest::Client, &str, S::Value) -> Result<u64, String>,
) {
    let rt = rt();
    let server = start(&rt);
    // No connection reuse: every request proves the server still accepts connections (a
    // pooled connection the server closed after a 413 would fail on the client side).
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .unwrap();
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: cases(),
            failure_persistence: None,
            ..Config::default()
        },
        // Seeded: the same cases on every run (`ROLLFLASH_FUZZ_CASES` explores further).
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let t0 = Instant::now();
    let sent = std::cell::Cell::new(0u64);
    let result = runner.run(&strategy, |v| {
        sent.set(sent.get() + case(&rt, &client, &server.url, v).map_err(TestCaseError::fail)?);
        Ok(())
    });
    eprintln!(
        "fuzz env-serve {name}: {} cases, {} requests, {:.1}s",
        cases(),
        sent.get(),
        t0.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        panic!("fuzz env-serve {name}: {e}");
    }
    // Still serves: a full create / reset / step / delete.
    rt.block_on(async {
        let u = &server.url;
        let created: Value = client
            .post(format!("{u}/envs"))
            .json(&json!({"name": "frozen_lake"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = created["env_id"].as_str().unwrap();
        for (route, body) in [
            ("reset", json!({"seed": 1})),
            ("step", json!({"action": "Up"})),
        ] {
            let s = client
                .post(format!("{u}/envs/{id}/{route}"))
                .json(&body)
                .send()
                .await
                .unwrap()
                .status();
            assert!(s.is_success(), "{route}: {s}");
        }
    });
    stop(&rt, server);
}

#[test]
fn fuzz_env_specs() {
    fuzz("specs", prop_oneof![spec(), tree()], |rt, c, u, v| {
        rt.block_on(async {
            let (status, text) = send(
                c,
                reqwest::Method::POST,
                format!("{u}/envs"),
                v.to_string().into_bytes(),
            )
            .await?;
            if status == 201 || status == 200 {
                let created: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
                let id = created["env_id"].as_str().unwrap_or_default();
                send(
                    c,
                    reqwest::Method::DELETE,
                    format!("{u}/envs/{id}"),
                    Vec::new(),
                )
                .await?;
                return Ok(2);
            }
            Ok(1)
        })
    });
}

#[test]
fn fuzz_episodes_with_arbitrary_reset_and_step_bodies() {
    let strategy = (
        prop::sample::select(vec!["frozen_lake", "sokoban", "tool_use", "math"]),
        prop_oneof![tree(), (0u64..1000).prop_map(|s| json!({ "seed": s }))],
        prop::collection::vec(
            prop_oneof![
                tree(),
                "\\PC{0,40}".prop_map(|a| json!({ "action": a })),
                // Near the 16 KiB body limit, and over it.
                (16_000usize..17_000).prop_map(|n| json!({ "action": "x".repeat(n) })),
            ],
            1..4,
        ),
    );
    fuzz("episodes", strategy, |rt, c, u, (name, reset, steps)| {
        rt.block_on(async {
            let (_, text) = send(
                c,
                reqwest::Method::POST,
                format!("{u}/envs"),
                json!({ "name": name }).to_string().into_bytes(),
            )
            .await?;
            let created: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let id = created["env_id"].as_str().unwrap_or_default().to_string();
            let mut n = 1;
            send(
                c,
                reqwest::Method::POST,
                format!("{u}/envs/{id}/reset"),
                reset.to_string().into_bytes(),
            )
            .await?;
            n += 1;
            for s in steps {
                send(
                    c,
                    reqwest::Method::POST,
                    format!("{u}/envs/{id}/step"),
                    s.to_string().into_bytes(),
                )
                .await?;
                n += 1;
            }
            send(
                c,
                reqwest::Method::DELETE,
                format!("{u}/envs/{id}"),
                Vec::new(),
            )
            .await?;
            Ok(n + 1)
        })
    });
}

#[test]
fn fuzz_raw_bytes_on_arbitrary_routes() {
    let methods = vec![
        reqwest::Method::GET,
        reqwest::Method::POST,
        reqwest::Method::PUT,
        reqwest::Method::DELETE,
    ];
    let strategy = (
        prop::sample::select(methods),
        prop_oneof![
            Just("/envs".to_string()),
            "/envs/[0-9a-z]{0,24}(/reset|/step)?",
            "/[a-z_/.%0-9]{0,24}",
        ],
        prop::collection::vec(any::<u8>(), 0..200),
    );
    fuzz("raw", strategy, |rt, c, u, (m, route, body)| {
        rt.block_on(async {
            send(c, m, format!("{u}{route}"), body).await?;
            Ok(1)
        })
    });
}

/// What the raw-bytes fuzzing found: a known route with the wrong method answered 405 with an
/// empty body; it is now a JSON error naming the route and method.
#[test]
fn wrong_method_gets_a_json_405() {
    let rt = rt();
    let server = start(&rt);
    rt.block_on(async {
        let (status, text) = send(
            &reqwest::Client::new(),
            reqwest::Method::PUT,
            format!("{}/envs", server.url),
            Vec::new(),
        )
        .await
        .unwrap();
        assert_eq!(status, 405);
        let e: ErrorBody = serde_json::from_str(&text).unwrap();
        assert_eq!(e.error.kind, "method_not_allowed");
        assert!(e.error.message.contains("PUT"), "{}", e.error.message);
    });
    stop(&rt, server);
}
