//! The client's retry, deadline and error rules against a scripted server (axum), and
//! against no server at all: the cases a real server shows only when something goes wrong.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use rollflash_tinker::{AdamParams, ClientConfig, RetryPolicy, TinkerClient, TinkerError};

/// The replies `retrieve_future` gives, in order; the last one repeats.
#[derive(Clone)]
struct Script {
    replies: Arc<Mutex<VecDeque<(u16, String)>>>,
    polls: Arc<Mutex<u32>>,
}

async fn optim_step() -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        r#"{"future_id":"7","status":"pending","request_id":"7"}"#,
    )
        .into_response()
}

async fn retrieve(State(s): State<Script>) -> Response {
    *s.polls.lock().unwrap() += 1;
    let (status, body) = {
        let mut q = s.replies.lock().unwrap();
        if q.len() > 1 {
            q.pop_front().unwrap()
        } else {
            q.front().cloned().unwrap()
        }
    };
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        body,
    )
        .into_response()
}

async fn serve(replies: &[(u16, &str)]) -> (String, Script) {
    let script = Script {
        replies: Arc::new(Mutex::new(
            replies.iter().map(|(s, b)| (*s, b.to_string())).collect(),
        )),
        polls: Arc::new(Mutex::new(0)),
    };
    let app = Router::new()
        .route("/api/v1/optim_step", post(optim_step))
        .route("/api/v1/retrieve_future", post(retrieve))
        .with_state(script.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, script)
}

fn client(url: &str) -> TinkerClient {
    let mut cfg = ClientConfig::new(url);
    cfg.retry = RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
    };
    cfg.poll_timeout = Duration::from_secs(5);
    cfg.future_deadline = Duration::from_secs(10);
    TinkerClient::new(cfg).unwrap()
}

const RESULT: &str = r#"{"metrics":{"skyrl.ai/grad_norm":2.5}}"#;

#[tokio::test]
async fn long_poll_timeouts_and_try_again_are_polled_through() {
    let (url, script) = serve(&[
        (408, r#"{"detail":"Timeout waiting for result"}"#),
        (
            200,
            r#"{"type":"try_again","request_id":"7","queue_state":"active"}"#,
        ),
        (503, "busy"),
        (408, r#"{"detail":"Timeout waiting for result"}"#),
        (200, RESULT),
    ])
    .await;
    let c = client(&url);
    let m = c
        .optim_step("m", 1, AdamParams::with_lr(1e-3))
        .await
        .unwrap();
    assert_eq!(m["skyrl.ai/grad_norm"], 2.5);
    assert_eq!(*script.polls.lock().unwrap(), 5);
    // The traffic counts every round trip (the submission and five polls), the bytes of
    // the answers, and the two backoffs (after the try_again and the 503: 5 ms, then 5 ms,
    // since the try_again reset the failure count).
    let t = c.traffic();
    assert_eq!(t.requests, 6, "{t:?}");
    let answers = [
        r#"{"future_id":"7","status":"pending","request_id":"7"}"#.len(),
        2 * r#"{"detail":"Timeout waiting for result"}"#.len(),
        r#"{"type":"try_again","request_id":"7","queue_state":"active"}"#.len(),
        "busy".len(),
        RESULT.len(),
    ];
    assert_eq!(t.bytes_in, answers.iter().sum::<usize>() as u64, "{t:?}");
    assert!(t.bytes_out > 0 && t.waiting > Duration::ZERO, "{t:?}");
    assert_eq!(t.backoff, Duration::from_millis(10), "{t:?}");
    // A clone counts into the same totals; a client counted apart does not.
    let apart = c.counted_apart();
    assert_eq!(apart.traffic().requests, 0);
    assert_eq!(c.clone().traffic(), t);
}

#[tokio::test]
async fn a_failed_future_names_the_call_and_keeps_the_body() {
    // SkyRL's shape: HTTP 400 {detail}.
    let (url, _) = serve(&[(
        400,
        r#"{"detail":"Maximum number of LoRA adapters (2) reached"}"#,
    )])
    .await;
    let e = client(&url)
        .optim_step("m", 1, AdamParams::with_lr(1e-3))
        .await
        .unwrap_err();
    match &e {
        TinkerError::FutureFailed {
            call,
            request_id,
            status,
            message,
            ..
        } => {
            assert_eq!(
                (*call, request_id.as_str(), *status),
                ("optim_step", "7", Some(400))
            );
            assert!(message.starts_with("Maximum number"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("optim_step"), "{e}");

    // Hosted Tinker's shape: 200 {error, category}.
    let (url, _) = serve(&[(200, r#"{"error":"bad datum","category":"user"}"#)]).await;
    let e = client(&url)
        .optim_step("m", 1, AdamParams::with_lr(1e-3))
        .await
        .unwrap_err();
    match e {
        TinkerError::FutureFailed {
            category, message, ..
        } => {
            assert_eq!(category.as_deref(), Some("user"));
            assert_eq!(message, "bad datum");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn unretryable_status_keeps_status_and_body() {
    let (url, _) = serve(&[(404, r#"{"detail":"Future not found"}"#)]).await;
    let e = client(&url)
        .optim_step("m", 1, AdamParams::with_lr(1e-3))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(404));
    assert_eq!(e.detail().as_deref(), Some("Future not found"));
}

#[tokio::test]
async fn retryable_errors_are_bounded() {
    // Always 503: given up after max_retries, with the last answer kept.
    let (url, script) = serve(&[(503, "still busy")]).await;
    let e = client(&url)
        .optim_step("m", 1, AdamParams::with_lr(1e-3))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(503));
    assert_eq!(e.body(), Some("still busy"));
    assert_eq!(*script.polls.lock().unwrap(), 4, "1 try + 3 retries");
}

#[tokio::test]
async fn a_future_that_never_finishes_hits_the_deadline() {
    let (url, _) = serve(&[(408, r#"{"detail":"Timeout waiting for result"}"#)]).await;
    let mut cfg = ClientConfig::new(url);
    cfg.future_deadline = Duration::from_millis(300);
    let e = TinkerClient::new(cfg)
        .unwrap()
        .optim_step("m", 1, AdamParams::with_lr(1e-3))
        .await
        .unwrap_err();
    match e {
        TinkerError::FutureTimeout {
            call, request_id, ..
        } => assert_eq!((call, request_id.as_str()), ("optim_step", "7")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_dead_port_names_the_url() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let e = client(&url).create_session(vec![]).await.unwrap_err();
    assert!(e.is_unreachable(), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&format!("{url}/api/v1/create_session")),
        "{text}"
    );
    // The transport error is kept as the source.
    assert!(std::error::Error::source(&e).is_some());
}
