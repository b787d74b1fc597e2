//! Checks against a real SkyRL 0.4.0 Tinker server on the tiny random Qwen3: one server for
//! the whole binary, one test that runs the checks in order (they share models and the
//! JIT-compiled shapes, which is what keeps the wall time at about a minute warm).
//!
//! Server-side loss definitions these checks hold SkyRL to (`skyrl/tinker/loss_fns.py`;
//! `logp` = the current policy's log-prob of the target, the `logprobs` field of the reply;
//! `w` = the `weights` input, 1 where absent; `q` = the `logprobs` input; `A` = `advantages`):
//! - `cross_entropy`:        elementwise_loss = -w · logp
//! - `importance_sampling`:  elementwise_loss = -w · exp(logp - q) · A
//!
//! The reply carries f32; we recompute the formula in f64 from the returned f32 `logp` and
//! compare with a tolerance of 1e-5 relative (plus 1e-6 absolute): the server's `exp` runs
//! in f32 on XLA, so the last bits may differ.

use std::collections::BTreeMap;
use std::time::Duration;

use rollflash_tinker::{
    AdamParams, ClientConfig, Datum, ForwardOutput, Heartbeat, LocalServer, LocalServerError,
    LoraConfig, SamplerSource, SamplingParams, StopReason, TinkerClient, TinkerError,
};

const LR: f64 = 1e-2;
const EOS: i32 = 2;

/// A deterministic token stream (vocab 512; ids 3..=511 are ordinary tokens).
fn tokens(seed: u32, len: usize) -> Vec<i32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345);
    let mut out = vec![1]; // <|im_start|>
    while out.len() < len {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        out.push(3 + ((x >> 16) % 509) as i32);
    }
    out
}

/// Next-token datums: input = seq[..n-1], targets = seq[1..]; the first `prompt` positions
/// weigh 0 (a prompt), the rest 1.
fn next_token(seq: &[i32], prompt: usize) -> (Vec<i32>, Vec<i64>, Vec<f32>) {
    let input = seq[..seq.len() - 1].to_vec();
    let targets = seq[1..].iter().map(|&t| i64::from(t)).collect();
    let weights = (0..input.len())
        .map(|i| if i < prompt { 0.0 } else { 1.0 })
        .collect();
    (input, targets, weights)
}

/// The schedule our client and the SDK both run: two cross-entropy steps, then one
/// importance-sampling step, each followed by an optim_step.
struct Step {
    loss_fn: &'static str,
    data: Vec<Datum>,
}

fn schedule() -> Vec<Step> {
    let lens = [8usize, 12, 16, 7];
    let ce: Vec<Datum> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let (input, targets, weights) = next_token(&tokens(i as u32, n), 2);
            Datum::cross_entropy(input, targets, weights)
        })
        .collect();
    let is: Vec<Datum> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let (input, targets, weights) = next_token(&tokens(10 + i as u32, n), 3);
            let len = input.len();
            // Behaviour log-probs near the random model's (-ln 512 ≈ -6.24), and advantages
            // of both signs, so the ratio and the sign both matter.
            let q: Vec<f32> = (0..len).map(|t| -6.0 - 0.05 * t as f32).collect();
            let adv: Vec<f32> = (0..len)
                .map(|t| {
                    if (i + t) % 3 == 0 {
                        -0.5
                    } else {
                        1.0 + 0.1 * i as f32
                    }
                })
                .collect();
            Datum::policy_gradient(input, targets, q, adv, Some(weights))
        })
        .collect();
    vec![
        Step {
            loss_fn: "cross_entropy",
            data: ce.clone(),
        },
        Step {
            loss_fn: "cross_entropy",
            data: ce,
        },
        Step {
            loss_fn: "importance_sampling",
            data: is,
        },
    ]
}

fn adam() -> AdamParams {
    AdamParams::with_lr(LR)
}

/// What one run of the schedule returned.
#[derive(Debug, PartialEq)]
struct Run {
    outputs: Vec<ForwardOutput>,
    grad_norms: Vec<f64>,
}

async fn run_schedule(c: &TinkerClient, model_id: &str, steps: &[Step]) -> Run {
    let mut outputs = Vec::new();
    let mut grad_norms = Vec::new();
    let mut seq = 1;
    for step in steps {
        let out = c
            .forward_backward(model_id, seq, &step.data, step.loss_fn, &[])
            .await
            .unwrap_or_else(|e| panic!("forward_backward {}: {e:?}", step.loss_fn));
        seq += 1;
        let metrics = c.optim_step(model_id, seq, adam()).await.unwrap();
        seq += 1;
        let g = metrics["skyrl.ai/grad_norm"];
        assert!(g.is_finite() && g > 0.0, "grad norm {g}");
        let lr = metrics["skyrl.ai/learning_rate"];
        assert!((lr - LR).abs() < 1e-8, "learning rate {lr}");
        grad_norms.push(g);
        outputs.push(out);
    }
    Run {
        outputs,
        grad_norms,
    }
}

fn close(a: f64, b: f64, rel: f64, abs: f64) -> bool {
    (a - b).abs() <= abs + rel * a.abs().max(b.abs())
}

/// Lengths, and the loss formulas of the module docs.
fn check_losses(step: &Step, out: &ForwardOutput) {
    assert_eq!(out.outputs.len(), step.data.len());
    for (d, o) in step.data.iter().zip(&out.outputs) {
        let n = d.model_input.len();
        let logp = o.logprobs().expect("logprobs");
        let loss = o.elementwise_loss().expect("elementwise_loss");
        assert_eq!(logp.len(), n, "one logprob per input token");
        assert_eq!(loss.len(), n, "one loss per input token");
        let f = |name: &str| match &d.loss_fn_inputs[name] {
            rollflash_tinker::LossInput::F32(v) => v.clone(),
            rollflash_tinker::LossInput::I64(_) => panic!("{name} is not f32"),
        };
        let w = f("weights");
        for t in 0..n {
            assert!(logp[t] <= 0.0 && logp[t].is_finite(), "logp {}", logp[t]);
            let lp = f64::from(logp[t]);
            let expected = match step.loss_fn {
                "cross_entropy" => -f64::from(w[t]) * lp,
                "importance_sampling" => {
                    let (q, a) = (f("logprobs"), f("advantages"));
                    -f64::from(w[t]) * (lp - f64::from(q[t])).exp() * f64::from(a[t])
                }
                other => panic!("no formula for {other}"),
            };
            assert!(
                close(f64::from(loss[t]), expected, 1e-5, 1e-6),
                "{} token {t}: server {} vs formula {expected}",
                step.loss_fn,
                loss[t]
            );
        }
    }
}

fn client(url: &str) -> TinkerClient {
    let mut cfg = ClientConfig::new(url);
    // A cold JIT compile of a new shape takes tens of seconds on two busy cores.
    cfg.future_deadline = Duration::from_secs(600);
    cfg.api_key = Some("tml-rollflash-test".into());
    TinkerClient::new(cfg).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_skyrl_server() {
    let server = match tokio::task::spawn_blocking(LocalServer::start)
        .await
        .unwrap()
    {
        Ok(s) => s,
        Err(LocalServerError::Unavailable(why)) => {
            eprintln!("SKIPPED real_skyrl_server: {why}");
            return;
        }
        Err(e) => panic!("{e}: {e:?}"),
    };
    let result = tokio::time::timeout(Duration::from_secs(900), checks(&server)).await;
    match result {
        Ok(()) => {}
        Err(_) => panic!(
            "the checks took over 15 minutes; server log:\n{}",
            server.log_tail(40)
        ),
    }
    drop(server);
}

async fn checks(server: &LocalServer) {
    let c = client(server.url());
    let t0 = std::time::Instant::now();
    let lap = |what: &str| eprintln!("[{:6.1} s] {what}", t0.elapsed().as_secs_f64());

    // The served model is named by the exact --base-model string.
    let caps = c.capabilities().await.unwrap();
    let names: Vec<_> = caps
        .supported_models
        .iter()
        .filter_map(|m| m.model_name.clone())
        .collect();
    assert_eq!(names, vec![server.base_model().to_string()]);

    let session = c.create_session(vec!["rollflash-it".into()]).await.unwrap();
    let heartbeat = Heartbeat::spawn(c.clone(), session.clone(), Duration::from_secs(2));

    let model_a = c
        .create_model(
            &session,
            0,
            server.base_model(),
            LoraConfig::new(8, Some(0)),
        )
        .await
        .unwrap();
    let info = c.get_info(&model_a.model_id).await.unwrap();
    assert_eq!(info.model_id, model_a.model_id);
    lap("session, model A");

    // Train A on the schedule: lengths and loss formulas per step.
    let steps = schedule();
    let run_a = run_schedule(&c, &model_a.model_id, &steps).await;
    for (step, out) in steps.iter().zip(&run_a.outputs) {
        check_losses(step, out);
    }
    lap(&format!("schedule on A, grad norms {:?}", run_a.grad_norms));

    // Determinism: a fresh model with the same seed, on the same data, gives the same
    // numbers, bit for bit.
    let model_b = c
        .create_model(
            &session,
            1,
            server.base_model(),
            LoraConfig::new(8, Some(0)),
        )
        .await
        .unwrap();
    let run_b = run_schedule(&c, &model_b.model_id, &steps).await;
    assert_eq!(run_a.grad_norms, run_b.grad_norms, "same seed, same data");
    assert_eq!(run_a.outputs, run_b.outputs);
    c.unload_model(&model_b.model_id).await.unwrap();
    lap("determinism (model B)");

    // forward-only: the same numbers twice (no state change), and different from step 0's
    // (the weights moved).
    let f1 = c
        .forward(&model_a.model_id, 100, &steps[0].data, "cross_entropy")
        .await
        .unwrap();
    let f2 = c
        .forward(&model_a.model_id, 101, &steps[0].data, "cross_entropy")
        .await
        .unwrap();
    assert_eq!(f1, f2);
    check_losses(&steps[0], &f1);
    assert_ne!(
        f1.outputs[0].logprobs(),
        run_a.outputs[0].outputs[0].logprobs()
    );
    lap("forward-only");

    // The SDK on the same server, same seed and data: the same losses and grad norms, and
    // (below) the same greedy sample from the trained weights.
    let prompt = tokens(99, 6);
    let sdk_greedy = sdk_crosscheck(server, &c, &steps, &run_a, &prompt).await;
    lap("SDK cross-check");

    // Sampling from saved weights.
    let path = c
        .save_weights_for_sampler(&model_a.model_id, "rust-step3")
        .await
        .unwrap();
    assert!(path.starts_with("tinker://"), "{path}");
    let sampler = c
        .create_sampling_session(&session, 0, SamplerSource::ModelPath(&path))
        .await
        .unwrap();
    let seeded = SamplingParams {
        max_tokens: 8,
        seed: Some(1),
        stop: vec![EOS],
        temperature: 1.0,
        top_k: -1,
        top_p: 1.0,
    };
    let s1 = c
        .sample(&sampler, 1, &prompt, 2, seeded.clone(), false)
        .await
        .unwrap();
    assert_eq!(s1.sequences.len(), 2);
    for s in &s1.sequences {
        assert!(!s.tokens.is_empty() && s.tokens.len() <= 8);
        assert!(s.tokens.iter().all(|&t| (0..512).contains(&t)));
        let lp = s.logprobs.as_ref().expect("sampled logprobs");
        assert_eq!(lp.len(), s.tokens.len());
        assert!(lp.iter().all(|&x| x <= 0.0 && x.is_finite()));
        match s.stop_reason {
            StopReason::Stop => assert_eq!(s.tokens.last(), Some(&EOS)),
            StopReason::Length => assert_eq!(s.tokens.len(), 8),
        }
    }
    let s1b = c
        .sample(&sampler, 2, &prompt, 2, seeded, false)
        .await
        .unwrap();
    assert_eq!(s1, s1b, "the same seed samples the same");
    let greedy = SamplingParams {
        max_tokens: 8,
        seed: None,
        stop: vec![EOS],
        temperature: 0.0,
        top_k: -1,
        top_p: 1.0,
    };
    let g1 = c
        .sample(&sampler, 3, &prompt, 1, greedy.clone(), false)
        .await
        .unwrap();
    let g2 = c
        .sample(&sampler, 4, &prompt, 1, greedy.clone(), false)
        .await
        .unwrap();
    assert_eq!(g1, g2, "temperature 0 is reproducible");
    assert_eq!(
        sdk_greedy,
        (
            g1.sequences[0].tokens.clone(),
            g1.sequences[0].logprobs.clone().unwrap()
        ),
        "greedy sample, SDK vs ours"
    );
    lap(&format!("sampling: greedy {:?}", g1.sequences[0].tokens));

    // Prompt log-probs of the sampler agree with the training model's forward pass at the
    // same weights (different code paths: sampler vs. training forward).
    let seq = tokens(7, 10);
    let pl = c
        .sample(
            &sampler,
            5,
            &seq,
            1,
            SamplingParams {
                max_tokens: 1,
                ..greedy.clone()
            },
            true,
        )
        .await
        .unwrap();
    let prompt_lp = pl.prompt_logprobs.expect("prompt logprobs");
    assert_eq!(prompt_lp.len(), seq.len(), "one per prompt token");
    assert_eq!(prompt_lp[0], None, "the first token has no context");
    let (input, targets, weights) = next_token(&seq, 0);
    let fwd = c
        .forward(
            &model_a.model_id,
            102,
            &[Datum::cross_entropy(input, targets, weights)],
            "cross_entropy",
        )
        .await
        .unwrap();
    let train_lp = fwd.outputs[0].logprobs().unwrap();
    for (t, lp) in train_lp.iter().enumerate() {
        let p = prompt_lp[t + 1].expect("defined after the first token");
        assert!(
            close(f64::from(p), f64::from(*lp), 1e-3, 1e-4),
            "token {t}: sampler {p} vs forward {lp}"
        );
    }
    lap("prompt logprobs");

    // Base-model sampling (the reserved adapter slot 0).
    let base = c
        .create_sampling_session(&session, 1, SamplerSource::BaseModel(server.base_model()))
        .await
        .unwrap();
    let b = c.sample(&base, 1, &prompt, 1, greedy, false).await.unwrap();
    assert_eq!(b.sequences.len(), 1);
    lap("base-model sampling");

    // Training state: save, load into a fresh model, and the fresh model computes the same.
    let state = c.save_state(&model_a.model_id, "state-1").await.unwrap();
    assert!(state.contains("/weights/state-1"), "{state}");
    let model_c = c
        .create_model(
            &session,
            2,
            server.base_model(),
            LoraConfig::new(8, Some(123)),
        )
        .await
        .unwrap();
    c.load_state(&model_c.model_id, &state, true).await.unwrap();
    let fc = c
        .forward(&model_c.model_id, 1, &steps[0].data, "cross_entropy")
        .await
        .unwrap();
    assert_eq!(fc, f1, "a loaded state computes what the saved model did");
    // load_weights is only a model's first request.
    let again = c
        .load_state(&model_c.model_id, &state, true)
        .await
        .unwrap_err();
    assert_eq!(again.status(), Some(400), "{again:?}");
    c.unload_model(&model_c.model_id).await.unwrap();
    lap("save_state / load_state");

    // Errors keep the server's status and body.
    let bad_loss = c
        .forward_backward(&model_a.model_id, 200, &steps[0].data, "no_such_loss", &[])
        .await
        .unwrap_err();
    assert_eq!(bad_loss.status(), Some(422), "{bad_loss:?}");
    assert!(bad_loss.body().unwrap().contains("loss_fn"), "{bad_loss:?}");
    let missing = c.get_info("model_nope").await.unwrap_err();
    assert_eq!(missing.status(), Some(404));
    assert_eq!(missing.detail().as_deref(), Some("Model not found"));
    // A loss the API accepts but the JAX backend does not: the future fails, and the
    // error names the call and keeps the server's text.
    let failed = c
        .forward_backward(&model_a.model_id, 201, &steps[0].data, "gspo", &[])
        .await
        .unwrap_err();
    match &failed {
        TinkerError::FutureFailed { call, message, .. } => {
            assert_eq!(*call, "forward_backward");
            assert!(message.contains("gspo"), "{message}");
        }
        other => panic!("expected a failed future, got {other:?}"),
    }
    assert!(
        failed.to_string().starts_with("forward_backward: request"),
        "{failed}"
    );
    lap("errors");

    c.unload_model(&model_a.model_id).await.unwrap();
    let hb = heartbeat.stop().await;
    assert!(hb.sent >= 1 && hb.failed == 0, "{hb:?}");
}

/// Runs scripts/tinker/sdk_crosscheck.py (the official SDK) on the same schedule and
/// compares. Tolerance: exact for the per-token numbers and the grad norms — the server is
/// deterministic, and both clients send the same f32/int64 bytes. Returns the SDK's greedy
/// sample of `prompt` from its trained weights (tokens, logprobs).
async fn sdk_crosscheck(
    server: &LocalServer,
    c: &TinkerClient,
    steps: &[Step],
    ours: &Run,
    prompt: &[i32],
) -> (Vec<i32>, Vec<f32>) {
    let to_json = |d: &Datum| {
        let inputs: BTreeMap<_, _> = d
            .loss_fn_inputs
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    rollflash_tinker::LossInput::F32(v) => serde_json::json!(v),
                    rollflash_tinker::LossInput::I64(v) => serde_json::json!(v),
                };
                (k.clone(), v)
            })
            .collect();
        serde_json::json!({"tokens": d.model_input, "loss_fn_inputs": inputs})
    };
    let plan = serde_json::json!({
        "base_model": server.base_model(),
        "rank": 8,
        "seed": 0,
        "adam": {"learning_rate": LR, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12},
        "steps": steps.iter().map(|s| serde_json::json!({
            "loss_fn": s.loss_fn,
            "datums": s.data.iter().map(to_json).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "sample": {"prompt": prompt, "max_tokens": 8, "num_samples": 1, "stop": [EOS]},
    });
    let dir = tempfile::tempdir().unwrap();
    let plan_path = dir.path().join("plan.json");
    std::fs::write(&plan_path, plan.to_string()).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/tinker/sdk_crosscheck.py");
    let out = tokio::process::Command::new(server.python())
        .arg(script)
        .arg("--url")
        .arg(server.url())
        .arg("--plan")
        .arg(&plan_path)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "sdk_crosscheck.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (i, (step, run_out)) in got["steps"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&ours.outputs)
        .enumerate()
    {
        let sdk_g = step["metrics"]["skyrl.ai/grad_norm"].as_f64().unwrap();
        assert_eq!(
            sdk_g, ours.grad_norms[i],
            "step {i}: grad norm, SDK vs ours"
        );
        for (field, ours_of) in [
            (
                "elementwise_loss",
                run_out
                    .outputs
                    .iter()
                    .map(|o| o.elementwise_loss().unwrap())
                    .collect::<Vec<_>>(),
            ),
            (
                "logprobs",
                run_out
                    .outputs
                    .iter()
                    .map(|o| o.logprobs().unwrap())
                    .collect::<Vec<_>>(),
            ),
        ] {
            let sdk: Vec<Vec<f32>> = serde_json::from_value(step[field].clone()).unwrap();
            assert_eq!(sdk, ours_of, "step {i}: {field}, SDK vs ours");
        }
    }
    let sdk_model = got["model_id"].as_str().unwrap();
    c.unload_model(sdk_model).await.unwrap();
    (
        serde_json::from_value(got["sample"]["tokens"][0].clone()).unwrap(),
        serde_json::from_value(got["sample"]["logprobs"][0].clone()).unwrap(),
    )
}
