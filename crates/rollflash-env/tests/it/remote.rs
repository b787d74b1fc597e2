//! Tests of `remote`: an in-process server on a loopback port, driven by `RemoteEnv` and by raw
//! HTTP requests.

use std::time::Duration;

use rollflash_env::envs::{make_env, EnvSpec};
use rollflash_env::remote::{
    constant_time_eq, serve, EnvServerConfig, ErrorBody, HealthResponse, RemoteEnv, RemoteEnvConfig,
};
use rollflash_env::{Env, EnvError, OutOfOrder, RemoteFailure};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::envs::{check_conformance, CONFORMANCE_ACTIONS};

/// A server on 127.0.0.1 with a port the OS picked, stopped by `stop`.
struct TestServer {
    url: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    async fn start(cfg: EnvServerConfig) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(serve(listener, cfg, async move {
            let _ = rx.await;
        }));
        TestServer {
            url,
            shutdown: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.task.await.expect("join").expect("serve");
    }

    /// Stops without waiting for requests in flight (a hung environment never finishes its).
    fn abort(self) {
        self.task.abort();
    }

    fn remote(&self, spec: &EnvSpec) -> RemoteEnv {
        RemoteEnv::new(RemoteEnvConfig::new(&self.url, spec.clone())).expect("remote env")
    }
}

fn spec(v: serde_json::Value) -> EnvSpec {
    serde_json::from_value(v).expect("spec")
}

fn specs() -> Vec<EnvSpec> {
    vec![
        spec(json!({"name": "frozen_lake"})),
        spec(json!({"name": "frozen_lake", "map": {"random": {"size": 6}}})),
        spec(json!({"name": "sokoban", "num_boxes": 1})),
        spec(json!({"name": "tool_use", "max_turns": 3})),
        spec(json!({"name": "math"})),
    ]
}

#[tokio::test]
async fn remote_episodes_match_in_process_step_by_step() {
    let server = TestServer::start(EnvServerConfig::default()).await;
    for spec in specs() {
        let mut local = make_env(&spec).expect("local");
        let mut remote = server.remote(&spec);
        for seed in [0u64, 3, 17] {
            let a = local.reset(seed).await.expect("local reset");
            let b = remote.reset(seed).await.expect("remote reset");
            assert_eq!(a, b, "{}: reset {seed}", spec.name());
            for action in CONFORMANCE_ACTIONS.iter().cycle().take(300) {
                let a = local.step(action).await.expect("local step");
                let b = remote.step(action).await.expect("remote step");
                assert_eq!(a, b, "{}: seed {seed}, action {action:?}", spec.name());
                if a.done() {
                    break;
                }
            }
        }
        remote.close().await.expect("close");
        assert_eq!(remote.env_id(), None);
    }
    let health: HealthResponse = reqwest::get(format!("{}/health", server.url))
        .await
        .expect("health")
        .json()
        .await
        .expect("json");
    assert_eq!(health.envs, 0, "every env was closed");
    server.stop().await;
}

#[tokio::test]
async fn remote_env_conforms() {
    let server = TestServer::start(EnvServerConfig::default()).await;
    for spec in specs() {
        let url = server.url.clone();
        check_conformance(move || {
            Box::new(
                RemoteEnv::new(RemoteEnvConfig::new(url.clone(), spec.clone())).expect("remote"),
            )
        })
        .await;
    }
    server.stop().await;
}

/// Sends `req`; returns the status and the decoded error body (if the body is one).
async fn raw(req: reqwest::RequestBuilder) -> (u16, Option<ErrorBody>) {
    let resp = req.send().await.expect("send");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (status, serde_json::from_str(&text).ok())
}

#[tokio::test]
async fn bad_requests_get_json_errors_with_the_right_status() {
    let server = TestServer::start(EnvServerConfig::default()).await;
    let c = reqwest::Client::new();
    let u = &server.url;

    // Malformed JSON.
    let (status, err) = raw(c.post(format!("{u}/envs")).body("{not json")).await;
    assert_eq!(status, 400);
    let err = err.expect("JSON error body").error;
    assert_eq!(err.kind, "bad_request");
    assert!(err.message.contains("invalid JSON"), "{}", err.message);

    // Unknown environment name, unknown field, invalid config.
    for (body, needle) in [
        (json!({"name": "chess"}), "chess"),
        (json!({"name": "sokoban", "boxes": 2}), "boxes"),
        (json!({"name": "sokoban", "width": 100}), "sokoban.width"),
    ] {
        let (status, err) = raw(c.post(format!("{u}/envs")).json(&body)).await;
        assert_eq!(status, 400, "{body}");
        let msg = err.expect("JSON error").error.message;
        assert!(msg.contains(needle), "{msg}");
    }

    // Unknown ids and routes.
    for req in [
        c.post(format!("{u}/envs/12345/reset"))
            .json(&json!({"seed": 1})),
        c.post(format!("{u}/envs/abc/step"))
            .json(&json!({"action": "Up"})),
        c.delete(format!("{u}/envs/999")),
        c.get(format!("{u}/nowhere")),
    ] {
        let (status, err) = raw(req).await;
        assert_eq!(status, 404);
        assert_eq!(err.expect("JSON error").error.kind, "not_found");
    }

    // Out of order: step before reset.
    let created: serde_json::Value = c
        .post(format!("{u}/envs"))
        .json(&json!({"name": "frozen_lake"}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let id = created["env_id"].as_str().expect("env_id").to_string();
    let (status, err) = raw(c
        .post(format!("{u}/envs/{id}/step"))
        .json(&json!({"action": "Up"})))
    .await;
    assert_eq!(status, 409);
    assert_eq!(err.expect("JSON error").error.kind, "out_of_order");

    // A reset body without a seed.
    let (status, _) = raw(c.post(format!("{u}/envs/{id}/reset")).json(&json!({}))).await;
    assert_eq!(status, 400);

    // Oversize body: over the default 1 MiB.
    let big = json!({"action": "x".repeat(1_200_000)});
    let (status, err) = raw(c.post(format!("{u}/envs/{id}/step")).json(&big)).await;
    assert_eq!(status, 413);
    assert_eq!(err.expect("JSON error").error.kind, "too_large");

    let (status, _) = raw(c.delete(format!("{u}/envs/{id}"))).await;
    assert_eq!(status, 204);
    server.stop().await;
}

#[tokio::test]
async fn api_key_is_required_and_checked() {
    let server = TestServer::start(EnvServerConfig {
        api_key: Some("s3cret-key".into()),
        ..Default::default()
    })
    .await;
    let c = reqwest::Client::new();
    let u = &server.url;
    let create = || {
        c.post(format!("{u}/envs"))
            .json(&json!({"name": "tool_use"}))
    };

    let (status, err) = raw(create()).await;
    assert_eq!(status, 401);
    assert_eq!(err.expect("JSON error").error.kind, "unauthorized");
    for wrong in ["s3cret-kex", "s3cret-key2", "", "s3cret"] {
        let (status, _) = raw(create().bearer_auth(wrong)).await;
        assert_eq!(status, 401, "{wrong:?}");
    }
    let (status, _) = raw(create().basic_auth("s3cret-key", None::<&str>)).await;
    assert_eq!(status, 401, "only bearer tokens");
    let (status, _) = raw(create().bearer_auth("s3cret-key")).await;
    assert_eq!(status, 201);
    // Health needs no key, so load balancers can probe it.
    let (status, _) = raw(c.get(format!("{u}/health"))).await;
    assert_eq!(status, 200);

    let spec = spec(json!({"name": "tool_use"}));
    let mut without = server.remote(&spec);
    match without.reset(0).await {
        Err(
            e @ EnvError::Remote {
                source: RemoteFailure::Status { status: 401, .. },
                ..
            },
        ) => {
            assert!(
                rollflash_core::error_chain(&e).contains("401 unauthorized"),
                "{e}"
            )
        }
        other => panic!("expected a 401, got {other:?}"),
    }
    let mut cfg = RemoteEnvConfig::new(&server.url, spec);
    cfg.api_key = Some("s3cret-key".into());
    assert!(
        !format!("{cfg:?}").contains("s3cret"),
        "keys stay out of logs"
    );
    let mut with = RemoteEnv::new(cfg).expect("remote");
    with.reset(0).await.expect("reset with key");
    with.step("<answer>1</answer>")
        .await
        .expect("step with key");
    server.stop().await;
}

#[test]
fn constant_time_compare() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(constant_time_eq(b"", b""));
    assert!(!constant_time_eq(b"abd", b"abc"));
    assert!(!constant_time_eq(b"ab", b"abc"));
    assert!(!constant_time_eq(b"abcd", b"abc"));
    assert!(!constant_time_eq(b"", b"a"));
    // A candidate that is the key plus 256 extra bytes must not wrap around to "equal".
    let long = [b"abc".as_slice(), &[0u8; 256]].concat();
    assert!(!constant_time_eq(&long, b"abc"));
}

#[tokio::test]
async fn capacity_idle_eviction_and_recreation() {
    let server = TestServer::start(EnvServerConfig {
        max_envs: 1,
        ..Default::default()
    })
    .await;
    let spec = spec(json!({"name": "frozen_lake"}));
    let mut a = server.remote(&spec);
    a.reset(1).await.expect("first env");
    let mut b = server.remote(&spec);
    match b.reset(1).await {
        Err(EnvError::Remote {
            source: RemoteFailure::Status { status, kind, .. },
            ..
        }) => assert_eq!((status, kind.as_deref()), (503, Some("capacity"))),
        other => panic!("expected capacity error, got {other:?}"),
    }
    a.close().await.expect("close");
    b.reset(1).await.expect("room after close");
    server.stop().await;

    // With a zero idle timeout every env not in a call is evicted by the next create.
    let server = TestServer::start(EnvServerConfig {
        max_envs: 1,
        idle_timeout: Some(Duration::ZERO),
        ..Default::default()
    })
    .await;
    let mut a = server.remote(&spec);
    let mut b = server.remote(&spec);
    let first = a.reset(5).await.expect("a");
    b.reset(5).await.expect("b evicts a");
    match a.step("Left").await {
        Err(EnvError::Remote {
            source: RemoteFailure::Status { status: 404, .. },
            ..
        }) => {}
        other => panic!("expected not found, got {other:?}"),
    }
    // The next reset makes a fresh server-side env (evicting b in turn).
    assert_eq!(a.reset(5).await.expect("recreated"), first);
    server.stop().await;
}

#[tokio::test]
async fn per_request_timeout_ends_a_hung_env() {
    let server = TestServer::start(EnvServerConfig::default()).await;
    let spec = spec(json!({"name": "frozen_lake", "failure": {"rate": 1.0, "kind": "hang"}}));
    let mut cfg = RemoteEnvConfig::new(&server.url, spec);
    cfg.timeout = Duration::from_millis(200);
    let mut env = RemoteEnv::new(cfg).expect("remote");
    match env.reset(0).await {
        Err(EnvError::Remote {
            source: RemoteFailure::Transport(e),
            ..
        }) => assert!(e.is_timeout(), "{e}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    server.abort();
}

#[tokio::test]
async fn served_env_names_can_be_restricted() {
    let server = TestServer::start(EnvServerConfig {
        allowed_envs: Some(vec!["sokoban".into()]),
        ..Default::default()
    })
    .await;
    let mut ok = server.remote(&spec(json!({"name": "sokoban"})));
    ok.reset(0).await.expect("sokoban is served");
    let mut no = server.remote(&spec(json!({"name": "frozen_lake"})));
    match no.reset(0).await {
        Err(EnvError::Remote {
            source:
                RemoteFailure::Status {
                    status: 400,
                    message,
                    ..
                },
            ..
        }) => assert!(message.contains("not served"), "{message}"),
        other => panic!("expected a 400, got {other:?}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn a_refused_connection_keeps_its_cause() {
    // A port nobody listens on: bind one, then free it.
    let addr = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        l.local_addr().expect("addr")
    };
    let url = format!("http://{addr}");
    let mut env =
        RemoteEnv::new(RemoteEnvConfig::new(&url, spec(json!({"name": "math"})))).expect("remote");
    let e = env.reset(0).await.expect_err("nobody listens");
    assert!(
        e.to_string().contains(&url),
        "the message names the server: {e}"
    );
    // The chain is EnvError -> RemoteFailure -> the reqwest error itself.
    let failure = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<RemoteFailure>())
        .unwrap_or_else(|| panic!("no RemoteFailure source: {e:?}"));
    let transport = std::error::Error::source(failure)
        .and_then(|s| s.downcast_ref::<reqwest::Error>())
        .unwrap_or_else(|| panic!("no reqwest source: {failure:?}"));
    assert!(transport.is_connect(), "{transport}");
}

#[tokio::test]
async fn an_undecodable_reply_keeps_the_json_error_and_out_of_order_says_which() {
    // A server that accepts `POST /envs` with a body that is not the protocol's JSON.
    let app = axum::Router::new().route(
        "/envs",
        axum::routing::post(|| async { (axum::http::StatusCode::CREATED, "not json") }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut env =
        RemoteEnv::new(RemoteEnvConfig::new(&url, spec(json!({"name": "math"})))).expect("remote");
    match env.reset(0).await {
        Err(e @ EnvError::Undecodable { .. }) => {
            let source = std::error::Error::source(&e).expect("a source");
            assert!(source.is::<serde_json::Error>(), "{source:?}");
            assert!(e.to_string().contains("undecodable reply"), "{e}");
        }
        other => panic!("expected an undecodable reply, got {other:?}"),
    }
    server.abort();

    // Step before reset is told apart from step after the end, locally and by the client.
    assert!(matches!(
        env.step("1").await,
        Err(EnvError::OutOfOrder(OutOfOrder::StepBeforeReset { .. }))
    ));
    let server = TestServer::start(EnvServerConfig::default()).await;
    let mut env = server.remote(&spec(json!({"name": "math"})));
    env.reset(0).await.expect("reset");
    env.step("1").await.expect("the one step");
    match env.step("1").await {
        Err(EnvError::OutOfOrder(OutOfOrder::Remote { reply, .. })) => {
            assert!(reply.starts_with("409 out_of_order"), "{reply}");
            assert!(reply.contains("step after the episode ended"), "{reply}");
        }
        other => panic!("expected out of order, got {other:?}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn remote_client_checks_the_server_and_releases_dropped_envs() {
    use rollflash_env::remote::RemoteEnvClient;
    let server = TestServer::start(EnvServerConfig {
        api_key: Some("k".into()),
        ..EnvServerConfig::default()
    })
    .await;
    let math = spec(json!({"name": "math"}));
    let mut cfg = RemoteEnvConfig::new(&server.url, math.clone());
    cfg.api_key = Some("k".into());
    let client = RemoteEnvClient::new(cfg.clone()).expect("client");
    assert_eq!(
        client.check().await.expect("check").envs,
        0,
        "the probe is deleted"
    );
    // A wrong key is found by the check (health alone needs none).
    let mut wrong = cfg.clone();
    wrong.api_key = Some("nope".into());
    let err = RemoteEnvClient::new(wrong).expect("client").check().await;
    assert!(
        matches!(
            err,
            Err(EnvError::Remote {
                source: RemoteFailure::Status { status: 401, .. },
                ..
            })
        ),
        "{err:?}"
    );
    // Environments share the client's pool; dropping one that holds a server-side env
    // (a cancelled trajectory) deletes it.
    let mut envs: Vec<_> = (0..3).map(|_| client.env()).collect();
    for (i, e) in envs.iter_mut().enumerate() {
        e.reset(i as u64).await.expect("reset");
    }
    let health = || async {
        reqwest::get(format!("{}/health", server.url))
            .await
            .expect("health")
            .json::<HealthResponse>()
            .await
            .expect("json")
            .envs
    };
    assert_eq!(health().await, 3);
    envs[0].close().await.expect("close");
    drop(envs);
    let mut live = health().await;
    for _ in 0..100 {
        if live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        live = health().await;
    }
    assert_eq!(live, 0, "dropped environments were deleted");
    // A server that is down is named by the check.
    server.stop().await;
    let err = client.check().await.expect_err("down");
    assert!(err.to_string().contains("/health"), "{err}");
}
