//! The HTTP routes over a run directory the test writes: the page and its assets, the JSON
//! routes and their filters, a malformed file's error, the loopback / API-key rule, and the
//! live snapshot of a running process.

use std::sync::Arc;

use async_trait::async_trait;
use rollflash_core::timeline::{EventKind, TimelineEvent, TimelineSink};
use rollflash_dashboard::{
    Dashboard, DashboardConfig, DashboardError, Live, LiveSource, Piece, Role, TimelineLog,
    TrajectoryLog, TrajectoryRecord,
};
use serde_json::{json, Value};

fn record(step: usize, reward: f64) -> TrajectoryRecord {
    TrajectoryRecord {
        step,
        trained_version: step as u64,
        seed: 1,
        index: 0,
        reward,
        step_rewards: vec![reward],
        finish: "terminated".into(),
        turns: 1,
        start_version: step as u64,
        response_tokens: 1,
        token_ids: vec![1, 2],
        pieces: vec![
            Piece {
                role: Role::Prompt,
                text: "2+2=".into(),
                version: 0,
            },
            Piece {
                role: Role::Model,
                text: "4".into(),
                version: step as u64,
            },
        ],
        notes: vec![("verdict".into(), "ok".into())],
    }
}

/// A run directory with three steps, a train and a generate bar, and four trajectories.
fn fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let steps: String = (0..3)
        .map(|s| {
            format!(
                "{}\n",
                json!({"step": s, "reward": 0.1 * s as f64, "elapsed_s": s})
            )
        })
        .collect();
    std::fs::write(dir.path().join("metrics.jsonl"), steps).unwrap();
    let tl = TimelineLog::create(dir.path(), false).unwrap();
    for (lane, kind, start) in [
        ("trainer", EventKind::Train, 1_000),
        ("engine-0", EventKind::Generate, 500),
    ] {
        tl.record(TimelineEvent {
            lane: lane.into(),
            kind,
            start_ms: start,
            end_ms: start + 400,
            version: 0,
            count: 8,
            tokens: 64,
        });
    }
    let tr = TrajectoryLog::create(dir.path(), false).unwrap();
    tr.append(&[
        record(0, 0.0),
        record(0, 1.0),
        record(1, 0.0),
        record(1, 1.0),
    ])
    .unwrap();
    dir
}

async fn start(dir: &std::path::Path, key: Option<&str>, live: Option<Live>) -> Dashboard {
    Dashboard::start(
        DashboardConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            api_key: key.map(str::to_string),
            run_dir: dir.to_path_buf(),
        },
        live,
    )
    .await
    .unwrap()
}

async fn get(d: &Dashboard, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("http://{}{path}", d.addr()))
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn get_json(d: &Dashboard, path: &str) -> Value {
    let (status, body) = get(d, path).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn the_page_and_the_json_routes_serve_the_run_directory() {
    let dir = fixture();
    let d = start(dir.path(), None, None).await;
    let (status, html) = get(&d, "/").await;
    assert_eq!(status, 200);
    assert!(html.contains("data-curve-points") && html.contains("app.js"));
    // No network at run time: the page loads nothing from anywhere else.
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "{html}"
    );
    let (status, js) = get(&d, "/app.js").await;
    assert_eq!(status, 200);
    assert!(js.contains("data-timeline-bars") || js.contains("timelineBarsTrain"));
    assert_eq!(get(&d, "/style.css").await.0, 200);

    let m = get_json(&d, "/api/metrics").await;
    assert_eq!(m["steps"].as_array().unwrap().len(), 3);
    assert_eq!(m["summary"], Value::Null);
    let t = get_json(&d, "/api/timeline").await;
    assert_eq!(t["events"].as_array().unwrap().len(), 2);
    let t = get_json(&d, "/api/timeline?since_ms=1000").await;
    assert_eq!(t["events"][0]["kind"], "train");
    assert_eq!(t["events"].as_array().unwrap().len(), 1);

    // Newest first; filtered by reward; limited.
    let tr = get_json(&d, "/api/trajectories").await;
    assert_eq!(tr["total"], 4);
    assert_eq!(tr["trajectories"][0]["step"], 1);
    let good = get_json(&d, "/api/trajectories?min_reward=0.5").await;
    let list = good["trajectories"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert!(list.iter().all(|t| t["reward"] == 1.0));
    let one = get_json(&d, "/api/trajectories?max_reward=0.5&limit=1").await;
    assert_eq!(one["trajectories"].as_array().unwrap().len(), 1);

    let live = get_json(&d, "/api/live").await;
    assert_eq!(
        (live["running"].clone(), live["phase"].clone()),
        (json!(false), json!("finished"))
    );
    d.shutdown().await;
}

#[tokio::test]
async fn a_malformed_file_is_an_error_naming_file_and_line() {
    let dir = fixture();
    std::fs::write(
        dir.path().join("metrics.jsonl"),
        "{\"step\":0}\n{oops\n{\"step\":2}\n",
    )
    .unwrap();
    let d = start(dir.path(), None, None).await;
    let (status, body) = get(&d, "/api/metrics").await;
    assert_eq!(status, 500);
    let e: Value = serde_json::from_str(&body).unwrap();
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("metrics.jsonl line 2"),
        "{body}"
    );
    d.shutdown().await;
}

#[tokio::test]
async fn beyond_loopback_needs_a_key_and_a_key_is_enforced() {
    let dir = fixture();
    let refused = Dashboard::start(
        DashboardConfig {
            addr: "0.0.0.0:0".parse().unwrap(),
            api_key: None,
            run_dir: dir.path().to_path_buf(),
        },
        None,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(refused, DashboardError::NeedsApiKey { .. }),
        "{refused}"
    );

    let d = start(dir.path(), Some("s3cret"), None).await;
    assert_eq!(get(&d, "/").await.0, 401);
    assert_eq!(get(&d, "/api/metrics?key=wrong").await.0, 401);
    assert_eq!(get(&d, "/?key=s3cret").await.0, 200);
    assert_eq!(get(&d, "/api/metrics?key=s3cret").await.0, 200);
    let r = reqwest::Client::new()
        .get(format!("http://{}/api/timeline", d.addr()))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    d.shutdown().await;
}

struct Fixed;

#[async_trait]
impl LiveSource for Fixed {
    async fn snapshot(&self) -> Value {
        json!({"queue_depth": 3, "backends": [{"name": "engine-0", "running": 5, "in_rotation": true}]})
    }
}

#[tokio::test]
async fn a_running_process_adds_its_phase_evaluation_and_rollout_snapshot() {
    let dir = fixture();
    let live = Live::default();
    live.set_phase("rl");
    live.set_eval_before(Some(json!({"success_rate": 0.25})));
    live.set_source(Some(Arc::new(Fixed)));
    let d = start(dir.path(), None, Some(live.clone())).await;
    let v = get_json(&d, "/api/live").await;
    assert_eq!(v["running"], true);
    assert_eq!(v["phase"], "rl");
    assert_eq!(v["eval_before"]["success_rate"], 0.25);
    assert_eq!(v["rollout"]["backends"][0]["running"], 5);
    live.set_source(None);
    assert_eq!(get_json(&d, "/api/live").await["rollout"], Value::Null);
    d.shutdown().await;
}
