//! Fuzzing the HTTP request parsing of `rollflash serve` (the in-process server over a real
//! engine) with proptest: JSON trees built from the routes' own field names with values of
//! every type and size, mutated valid bodies, raw bytes, unknown routes and methods. Whatever
//! arrives, the server answers (it never drops the connection or crashes), with a 2xx or a
//! clear JSON error — never a 500 — and it still serves normally afterwards.
//!
//! `ROLLFLASH_FUZZ_CASES` raises the number of cases per target (default 256) for a longer
//! run; every target prints how many cases it ran and how long they took.

use std::sync::Arc;
use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use rollflash_rollout::{Backend, ServerConfig, WeightsAccess};
use serde_json::{json, Map, Value};

use crate::common;
use crate::http::{start_server_with, TestServer};

/// Field names the routes know, plus a few they do not.
const KEYS: &[&str] = &[
    "text",
    "input_ids",
    "sampling_params",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stop_token_ids",
    "sampling_seed",
    "seed",
    "ignore_eos",
    "return_logprob",
    "rid",
    "stream",
    "rollflash_resumed_len",
    "prompt",
    "messages",
    "role",
    "content",
    "model",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "n",
    "model_path",
    "weight_version",
    "abort_all_requests",
    "mode",
    "type",
    "zzz_unknown",
];

const ROUTES: &[&str] = &[
    "/generate",
    "/v1/completions",
    "/v1/chat/completions",
    "/abort_request",
    "/update_weights_from_disk",
    "/pause_generation",
    "/continue_generation",
    "/flush_cache",
];

fn cases() -> u32 {
    std::env::var("ROLLFLASH_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

/// Numbers where parsers and arithmetic break: signs, zero, the edges of u32/u64/usize,
/// fractions, huge floats.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-3i64..200).prop_map(Value::from),
        prop::sample::select(vec![
            json!(0),
            json!(-1),
            json!(u32::MAX),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(1e300),
            json!(-1e-300),
            json!(0.5),
            json!(1.0000001),
        ]),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        "[ -~]{0,12}".prop_map(Value::String),
        "\\PC{0,8}".prop_map(Value::String),
        prop::collection::vec(0u32..120, 0..12).prop_map(|v| json!(v)),
    ]
}

/// JSON trees whose keys are mostly real field names.
fn tree() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|kv| {
                let m: Map<String, Value> =
                    kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                Value::Object(m)
            }),
        ]
    })
}

/// Valid bodies for each route, to be mutated byte by byte.
fn valid_bodies() -> Vec<(&'static str, String)> {
    vec![
        (
            "/generate",
            json!({"input_ids": [2, 40, 41], "sampling_params": {"max_new_tokens": 4}, "rid": "r"}).to_string(),
        ),
        (
            "/generate",
            json!({"text": "Q: 1+2\nA:", "sampling_params": {"max_new_tokens": 3, "temperature": 0}, "return_logprob": true}).to_string(),
        ),
        (
            "/v1/completions",
            json!({"prompt": "1+1=", "max_tokens": 3, "n": 2, "logprobs": 1}).to_string(),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).to_string(),
        ),
        ("/abort_request", json!({"rid": "r"}).to_string()),
        (
            "/update_weights_from_disk",
            json!({"model_path": "ckpt", "weight_version": "3"}).to_string(),
        ),
    ]
}

/// Sends one request; checks the answer's shape. A transport error means the server
/// dropped the connection (or crashed): a failure.
async fn check(
    client: &reqwest::Client,
    server: &TestServer,
    method: reqwest::Method,
    route: &str,
    body: Vec<u8>,
) -> Result<(), String> {
    let resp = client
        .request(method.clone(), format!("{}{route}", server.url()))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .map_err(|e| format!("{method} {route}: no answer: {e}"))?;
    let status = resp.status().as_u16();
    let text = resp
        .text()
        .await
        .map_err(|e| format!("{method} {route}: body lost: {e}"))?;
    let shown = || {
        String::from_utf8_lossy(&body)
            .chars()
            .take(300)
            .collect::<String>()
    };
    if status >= 500 && status != 503 {
        return Err(format!("{method} {route} {}: {status} {text}", shown()));
    }
    if !(200..300).contains(&status) {
        let v: Value = serde_json::from_str(&text)
            .map_err(|_| format!("{method} {route} {}: {status}, not JSON: {text}", shown()))?;
        let msg = v["error"]["message"]
            .as_str()
            .or_else(|| v["message"].as_str())
            .unwrap_or_default();
        if msg.is_empty() {
            return Err(format!(
                "{method} {route} {}: {status} without a message: {text}",
                shown()
            ));
        }
    }
    Ok(())
}

/// Runs `strategy` for `cases()` cases, each producing requests to send; prints counts and
/// time.
fn fuzz<S: Strategy>(
    name: &str,
    rt: &tokio::runtime::Runtime,
    server: &TestServer,
    strategy: S,
    to_requests: impl Fn(S::Value) -> Vec<(reqwest::Method, String, Vec<u8>)>,
) {
    // A hang is a failure, not a stuck test.
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
        for (method, route, body) in to_requests(v) {
            sent.set(sent.get() + 1);
            rt.block_on(check(&client, server, method, &route, body))
                .map_err(TestCaseError::fail)?;
        }
        // A fuzzed body may well be a valid `/pause_generation`: undo it, or every later
        // generation would (rightly) wait.
        // (Built inside the runtime: the client's timeout needs its timer.)
        rt.block_on(async {
            client
                .post(format!("{}/continue_generation", server.url()))
                .send()
                .await
        })
        .map_err(|e| TestCaseError::fail(format!("continue_generation: {e}")))?;
        Ok(())
    });
    eprintln!(
        "fuzz {name}: {} cases, {} requests, {:.1}s",
        cases(),
        sent.get(),
        t0.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        panic!("fuzz {name}: {e}");
    }
}

fn start(rt: &tokio::runtime::Runtime, root: &std::path::Path) -> TestServer {
    rt.block_on(async {
        let engine = common::engine_backend_over("fuzz", common::tiny_model_with_vocab(3, 100), 8);
        start_server_with(
            engine as Arc<dyn Backend>,
            ServerConfig {
                max_body_bytes: 64 * 1024,
                weights: WeightsAccess::Under(root.to_path_buf()),
                ..Default::default()
            },
        )
        .await
    })
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The server still generates normally after the fuzzing.
fn assert_still_serves(rt: &tokio::runtime::Runtime, server: &TestServer) {
    rt.block_on(async {
        let v: Value = reqwest::Client::new()
            .post(format!("{}/generate", server.url()))
            .json(&json!({"input_ids": [2, 40, 41], "sampling_params": {"max_new_tokens": 2}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["output_ids"].as_array().map(Vec::len), Some(2), "{v}");
    });
}

#[test]
fn fuzz_json_trees_on_every_route() {
    let rt = rt();
    let root = tempfile::tempdir().unwrap();
    let server = start(&rt, root.path());
    fuzz(
        "json trees",
        &rt,
        &server,
        (prop::sample::select(ROUTES), tree()),
        |(route, v)| {
            vec![(
                reqwest::Method::POST,
                route.to_string(),
                v.to_string().into_bytes(),
            )]
        },
    );
    assert_still_serves(&rt, &server);
    rt.block_on(server.stop()).unwrap();
}

#[test]
fn fuzz_mutated_valid_bodies() {
    let rt = rt();
    let root = tempfile::tempdir().unwrap();
    let server = start(&rt, root.path());
    let bodies = valid_bodies();
    let n = bodies.len();
    // (which body, edits: (position fraction, kind, byte)).
    let strategy = (
        0..n,
        prop::collection::vec((0.0f64..1.0, 0u8..4, any::<u8>()), 1..6),
    );
    fuzz(
        "mutated bodies",
        &rt,
        &server,
        strategy,
        move |(i, edits)| {
            let (route, body) = &bodies[i];
            let mut b = body.clone().into_bytes();
            for (at, kind, byte) in edits {
                let pos = ((b.len() as f64) * at) as usize;
                match kind {
                    0 if pos < b.len() => b[pos] = byte,
                    1 => b.insert(pos.min(b.len()), byte),
                    2 if pos < b.len() => {
                        b.remove(pos);
                    }
                    _ => b.truncate(pos),
                }
            }
            vec![(reqwest::Method::POST, route.to_string(), b)]
        },
    );
    assert_still_serves(&rt, &server);
    rt.block_on(server.stop()).unwrap();
}

#[test]
fn fuzz_raw_bytes_unknown_routes_and_methods() {
    let rt = rt();
    let root = tempfile::tempdir().unwrap();
    let server = start(&rt, root.path());
    let methods = vec![
        reqwest::Method::GET,
        reqwest::Method::POST,
        reqwest::Method::PUT,
        reqwest::Method::DELETE,
        reqwest::Method::PATCH,
    ];
    let strategy = (
        prop::sample::select(methods),
        prop_oneof![
            prop::sample::select(ROUTES).prop_map(str::to_string),
            "/[a-z_/.%0-9]{0,24}",
        ],
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            // Larger than the 64 KiB body limit.
            (65_537usize..70_000).prop_map(|n| vec![b'['; n]),
        ],
    );
    fuzz("raw bytes", &rt, &server, strategy, |(m, route, body)| {
        vec![(m, route, body)]
    });
    assert_still_serves(&rt, &server);
    rt.block_on(server.stop()).unwrap();
}

/// The overflow the fuzzing found: `max_new_tokens` near `usize::MAX` with a resumed part
/// overflowed when the resumed length was added (a panic in debug builds). Now refused or
/// served, never a crash.
#[test]
fn huge_max_new_tokens_with_a_resumed_part_does_not_overflow() {
    let rt = rt();
    let root = tempfile::tempdir().unwrap();
    let server = start(&rt, root.path());
    rt.block_on(async {
        let body = json!({
            "input_ids": [2, 40, 41, 42],
            "rollflash_resumed_len": 2,
            "sampling_params": {"max_new_tokens": u64::MAX, "temperature": 0},
        });
        check(
            &reqwest::Client::new(),
            &server,
            reqwest::Method::POST,
            "/generate",
            body.to_string().into_bytes(),
        )
        .await
        .unwrap();
    });
    assert_still_serves(&rt, &server);
    rt.block_on(server.stop()).unwrap();
}
