//! The trajectory sampler: a spread over the batch's rewards (best and worst kept), prompt,
//! model tokens with their versions, and environment observations as pieces.

use rollflash_core::buffer::{Batch, BatchGroup, GroupKey};
use rollflash_core::{PolicyVersion, Trajectory, TrajectoryEnd};
use rollflash_dashboard::{sample_batch, Role};

/// Tokens are bytes; decoding is UTF-8 (lossy, as byte-level BPE decoders are).
fn decode(ids: &[u32]) -> Option<String> {
    let bytes: Vec<u8> = ids.iter().map(|&i| i as u8).collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Prompt "Q:", model "ab" at v1, observation "!" , model "é" (two bytes) at v2.
fn trajectory(reward: f64, index: usize) -> Trajectory {
    let mut t = Trajectory {
        start_version: PolicyVersion(1),
        prompt_len: 2,
        seed: 9,
        index,
        reward,
        end: Some(TrajectoryEnd::Terminated),
        ..Default::default()
    };
    for b in b"Q:" {
        t.push(u32::from(*b), 0, 0.0, PolicyVersion(1));
    }
    for b in b"ab" {
        t.push(u32::from(*b), 1, -0.5, PolicyVersion(1));
    }
    t.push(u32::from(b'!'), 0, 0.0, PolicyVersion(1));
    for b in "é".as_bytes() {
        t.push(u32::from(*b), 1, -0.5, PolicyVersion(2));
    }
    t
}

fn batch(rewards: &[f64]) -> Batch<Trajectory> {
    Batch {
        version: PolicyVersion(2),
        groups: vec![BatchGroup {
            key: GroupKey(0),
            start: PolicyVersion(1),
            samples: rewards
                .iter()
                .enumerate()
                .map(|(i, r)| (trajectory(*r, i), *r))
                .collect(),
        }],
    }
}

#[test]
fn the_sample_spans_the_rewards_and_each_record_keeps_text_and_versions() {
    let b = batch(&[0.5, 1.0, 0.0, 0.25, 0.75]);
    let recs = sample_batch(7, &b, 3, &decode);
    let rewards: Vec<f64> = recs.iter().map(|r| r.reward).collect();
    assert_eq!(rewards, vec![1.0, 0.5, 0.0], "best, middle, worst");
    let r = &recs[0];
    assert_eq!(
        (r.step, r.trained_version, r.seed, r.finish.as_str()),
        (7, 2, 9, "terminated")
    );
    assert_eq!(r.response_tokens, 4);
    let pieces: Vec<(Role, &str, u64)> = r
        .pieces
        .iter()
        .map(|p| (p.role, p.text.as_str(), p.version))
        .collect();
    // The two bytes of "é" show as one character, on the token that completes it.
    assert_eq!(
        pieces,
        vec![
            (Role::Prompt, "Q:", 1),
            (Role::Model, "a", 1),
            (Role::Model, "b", 1),
            (Role::Env, "!", 1),
            (Role::Model, "", 2),
            (Role::Model, "é", 2),
        ]
    );
    assert_eq!(r.token_ids.len(), 7);
    assert!(sample_batch(0, &b, 0, &decode).is_empty());
    assert_eq!(sample_batch(0, &b, 50, &decode).len(), 5);
}

#[test]
fn what_the_environment_said_in_words_reaches_the_record() {
    let mut t = trajectory(0.0, 0);
    t.env_text = vec![
        ("verdict".into(), "reward_failed".into()),
        (
            "reward_error".into(),
            "ValueError: row 5 is poisoned".into(),
        ),
    ];
    let b = Batch {
        version: PolicyVersion(2),
        groups: vec![BatchGroup {
            key: GroupKey(0),
            start: PolicyVersion(1),
            samples: vec![(t, 0.0)],
        }],
    };
    let r = &sample_batch(1, &b, 1, &decode)[0];
    let line = serde_json::to_value(r).unwrap();
    assert_eq!(
        line["notes"],
        serde_json::json!([
            ["verdict", "reward_failed"],
            ["reward_error", "ValueError: row 5 is poisoned"]
        ])
    );
    // A record with nothing said has no `notes`, and a line written before there were
    // any reads back.
    let quiet = &sample_batch(1, &batch(&[1.0]), 1, &decode)[0];
    let mut line = serde_json::to_value(quiet).unwrap();
    assert!(line.get("notes").is_none(), "{line}");
    line.as_object_mut().unwrap().remove("notes");
    let back: rollflash_dashboard::TrajectoryRecord = serde_json::from_value(line).unwrap();
    assert!(back.notes.is_empty());
}
