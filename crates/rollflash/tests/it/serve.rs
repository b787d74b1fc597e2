//! `rollflash serve` as a real process, driven through the HTTP backends: generation, a weight
//! update from a checkpoint the test writes under `--weights-root`, and the API key.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

use candle_core::{DType, Device};
use rollflash_core::{FinishReason, GenRequest, PolicyVersion, RequestId, SamplingParams};
use rollflash_model::config::ModelConfig;
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::weights::Weights;
use rollflash_rollout::{
    Backend, BackendError, HttpBackendConfig, OpenAiBackend, OpenAiConfig, SglangBackend,
    WeightUpdate,
};
use serde_json::Value;

/// A running `rollflash serve`, killed when dropped.
struct ServeProcess {
    child: Child,
    /// Kept open so the server never writes to a closed pipe.
    _stdout: BufReader<ChildStdout>,
    url: String,
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `rollflash serve --port 0 ARGS` with `envs`, and reads the address from its first
/// line; stderr goes to `log` so a failed start can say why.
fn start(args: &[&str], envs: &[(&str, &str)], log: &Path) -> ServeProcess {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollflash"));
    cmd.args(["serve", "--port", "0", "--threads", "1"])
        .args(args)
        .env_remove("ROLLFLASH_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawning rollflash serve");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let Some(url) = line.trim().strip_prefix("listening on ") else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "rollflash serve did not start: stdout {line:?}, stderr:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    };
    ServeProcess {
        url: url.to_string(),
        child,
        _stdout: stdout,
    }
}

/// Writes a checkpoint of the built-in model's architecture with weights from `seed`.
fn write_checkpoint(dir: &Path, seed: u64) {
    let tok = Tokenizer::builtin();
    let cfg = ModelConfig::builtin_default(tok.vocab_size(), tok.eos_token_id().unwrap());
    let w = Weights::random(&cfg, seed, DType::F32, &Device::Cpu).unwrap();
    rollflash_model::hf::save_dir(dir, &cfg, &w, Some(&tok)).unwrap();
}

fn client(p: &ServeProcess, key: Option<&str>) -> HttpBackendConfig {
    HttpBackendConfig {
        api_key: key.map(str::to_string),
        ..HttpBackendConfig::new(p.url.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_generates_and_loads_weights_from_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("checkpoints");
    write_checkpoint(&root.join("step-3"), 11);
    let outside = tmp.path().join("elsewhere");
    write_checkpoint(&outside, 12);
    let server = start(
        &["--weights-root", root.to_str().unwrap(), "--init-seed", "5"],
        &[("ROLLFLASH_API_KEY", "k3y")],
        &tmp.path().join("serve.log"),
    );
    assert!(
        server.url.starts_with("http://127.0.0.1:"),
        "{}",
        server.url
    );

    let sgl = SglangBackend::new(client(&server, Some("k3y"))).unwrap();
    sgl.health().await.unwrap();
    let req = GenRequest::new(
        RequestId(1),
        Tokenizer::builtin().encode("12+30=", true).unwrap(),
        SamplingParams::greedy(8),
    );
    let before = sgl.generate(req.clone()).await.unwrap();
    assert_eq!(before.output.len(), 8);
    assert_eq!(before.finish_reason, FinishReason::Length);
    assert!(before
        .output
        .versions
        .iter()
        .all(|v| *v == PolicyVersion(0)));
    assert!(before
        .output
        .logprobs
        .iter()
        .all(|lp| lp.is_finite() && *lp <= 0.0));

    sgl.update_weights(&WeightUpdate::Disk {
        path: root.join("step-3"),
        version: PolicyVersion(3),
    })
    .await
    .unwrap();
    let after = sgl.generate(req.clone()).await.unwrap();
    assert!(after.output.versions.iter().all(|v| *v == PolicyVersion(3)));
    assert_ne!(after.output.logprobs, before.output.logprobs);
    let info: Value = reqwest::Client::new()
        .get(format!("{}/get_model_info", server.url))
        .bearer_auth("k3y")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["weight_version"], "3");

    // The OpenAI side of the same process agrees.
    let oai = OpenAiBackend::new(OpenAiConfig {
        http: client(&server, Some("k3y")),
        ..OpenAiConfig::new("")
    })
    .unwrap();
    let via_oai = oai.generate(req.clone()).await.unwrap();
    assert_eq!(via_oai.output.tokens, after.output.tokens);
    assert_eq!(via_oai.output.versions, after.output.versions);

    // Outside the weights root: refused, version unchanged.
    let e = sgl
        .update_weights(&WeightUpdate::Disk {
            path: outside,
            version: PolicyVersion(4),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&e, BackendError::InvalidRequest { reason, .. } if reason.contains("403")),
        "{e}"
    );
    // Without the key: refused, and not retried.
    let anonymous = SglangBackend::new(client(&server, None)).unwrap();
    let e = anonymous.generate(req).await.unwrap_err();
    assert!(
        matches!(&e, BackendError::Protocol { reason, .. } if reason.contains("401")),
        "{e}"
    );
    // /health stays open for probes.
    anonymous.health().await.unwrap();
}

/// The official `openai` Python client against a real server, through
/// `scripts/openai_client_check.py`; skipped (with a note) when `.venv` has no `openai`
/// (`scripts/setup_openai.sh` installs it), so the suite needs no Python packages.
#[test]
fn the_openai_python_client_accepts_our_answers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    let has_openai = Command::new(&python)
        .args(["-c", "import openai"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_openai {
        eprintln!(
            "skipped: {} cannot import openai (run scripts/setup_openai.sh)",
            python.display()
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let server = start(
        &[],
        &[("ROLLFLASH_API_KEY", "k3y")],
        &tmp.path().join("serve.log"),
    );
    let out = Command::new(&python)
        .arg(root.join("scripts/openai_client_check.py"))
        .args(["--base-url", &server.url, "--api-key", "k3y"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "openai_client_check.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}
