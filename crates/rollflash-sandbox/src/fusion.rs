//! The remote sandbox: a client for a SandboxFusion server's `POST /run_code`
//! (bytedance/SandboxFusion), its wire types, and the mapping of its answer to the same
//! [`Verdict`]s the local sandbox gives.
//!
//! **Wire format** (SandboxFusion's `RunCodeRequest`/`RunCodeResponse`, its API docs'
//! "Run Code" page). We send `code`, `language` (`"python"`), `run_timeout` and
//! `compile_timeout` (both `wall_secs`), `memory_limit_MB` (`memory_mb`) and `stdin` (when
//! the program has input); `files` and `fetch_files` keep their defaults (none). The answer's
//! `status` is `Success`, `Failed` (the program failed: a non-zero return code or a time
//! limit) or `SandboxError` (the server failed, with its reason in `message`); its
//! `compile_result` and `run_result` each carry a `status` (`Finished`, `Error`,
//! `TimeLimitExceeded`), `execution_time` (seconds), `return_code`, `stdout` and `stderr`.
//! Fields we do not use (`executor_pod_name`, `files`) are ignored; an unknown `status` is
//! an undecodable answer, never a guessed verdict. Checked against a real server
//! (bytedance/SandboxFusion 469de08, `tests/it/fusion.rs`): a killed program's
//! `return_code` is minus the signal, and a timed-out one has `TimeLimitExceeded` with a
//! null `return_code`, as assumed here.
//!
//! **Reliability.** Every request has a deadline (`wall_secs + remote_margin_secs`), covering
//! connection, queueing on the server and reading the body. Transient failures (no
//! connection, HTTP 408, 429 or 5xx, a body cut off, the server's own `SandboxError`) are
//! retried `retries` times after a doubling backoff; running a program again is harmless, as
//! it has no effects outside the server's sandbox. Refusals (401, 403), other 4xx answers,
//! undecodable bodies and deadlines are not: the next attempt would be the same. The body
//! read is capped (see [`max_body`]), so a server that streams without end cannot hold this
//! process's memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, Limits, SandboxConfig};
use crate::program::{Language, Program};
use crate::sandbox::{classify, SandboxError};
use crate::verdict::{Execution, Verdict};

/// The first backoff before a retry; it doubles with each retry.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// The longest backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Bytes kept of an error answer's body, for the error message.
const ERROR_BODY_BYTES: usize = 2048;
/// Room in a body for what is not program output: field names, the status, the server's
/// message and pod name.
const BODY_OVERHEAD: usize = 64 * 1024;

/// A SandboxFusion server, as one run's sandbox calls it.
pub(crate) struct Remote {
    /// The base URL as configured, for error messages.
    url: String,
    /// `url` + `/run_code`.
    endpoint: String,
    http: reqwest::Client,
    /// The API key, when one is configured. Never printed: sent through `bearer_auth`,
    /// which marks the header sensitive, so the HTTP stack's own logs leave it out too.
    key: Option<String>,
    retries: u32,
    margin: Duration,
    /// Requests sent again after a transient failure (for tests and logs).
    retried: AtomicU64,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not derived: the key must not reach a log line.
        f.debug_struct("Remote")
            .field("url", &self.url)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("retries", &self.retries)
            .field("margin", &self.margin)
            .finish()
    }
}

/// `POST /run_code`'s body.
#[derive(Debug, Serialize)]
struct RunCodeRequest<'a> {
    code: &'a str,
    language: &'static str,
    compile_timeout: f64,
    run_timeout: f64,
    #[serde(rename = "memory_limit_MB")]
    memory_limit_mb: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    stdin: Option<&'a str>,
}

/// `POST /run_code`'s answer.
#[derive(Debug, Deserialize)]
struct RunCodeResponse {
    status: RunStatus,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    compile_result: Option<CommandRunResult>,
    #[serde(default)]
    run_result: Option<CommandRunResult>,
}

/// The whole request's outcome, as the server judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum RunStatus {
    Success,
    Failed,
    SandboxError,
}

/// One command's outcome (the compiler's or the program's).
#[derive(Debug, Deserialize)]
struct CommandRunResult {
    status: CommandRunStatus,
    #[serde(default)]
    execution_time: Option<f64>,
    #[serde(default)]
    return_code: Option<i32>,
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    stderr: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum CommandRunStatus {
    Finished,
    /// The server could not run the command (its failure, not the program's).
    Error,
    TimeLimitExceeded,
}

/// Why one attempt failed, and whether another may succeed.
enum Attempt {
    /// Worth sending again: what failed, and the client's error when there was one.
    Transient(String, Option<reqwest::Error>),
    /// The server's own `SandboxError` status, with its message.
    ServerFailed(String),
    /// Sending it again would fail the same way.
    Final(SandboxError),
}

/// What a completed attempt brought back.
enum Answer {
    Body(Vec<u8>),
    /// A 2xx body longer than [`max_body`].
    Oversized,
}

/// The largest body a response to `program` can have when each output stream is within
/// `output_bytes`: JSON escapes a byte in at most 6 (`\u0000`), there are up to four streams
/// (the compiler's and the program's stdout and stderr), and on a failure the server's
/// message may quote the program. A longer body can only come from output past the cap.
fn max_body(output_bytes: usize, program: &Program) -> usize {
    output_bytes
        .saturating_mul(4)
        .saturating_add(program.source.len())
        .saturating_mul(6)
        .saturating_add(BODY_OVERHEAD)
}

impl Remote {
    /// A client for the server in `config` (validated), reading its API key from the
    /// environment now.
    pub(crate) fn new(config: &SandboxConfig) -> Result<Remote, SandboxError> {
        let Some(url) = config.url.clone() else {
            return Err(ConfigError {
                field: "url",
                reason: "is required with kind = \"sandbox_fusion\"".into(),
            }
            .into());
        };
        let key = match &config.api_key_env {
            None => None,
            Some(var) => match std::env::var(var) {
                Ok(key) if !key.is_empty() => Some(key),
                Ok(_) => {
                    return Err(ConfigError {
                        field: "api_key_env",
                        reason: format!("the environment variable {var} is empty"),
                    }
                    .into())
                }
                Err(e) => {
                    return Err(ConfigError {
                        field: "api_key_env",
                        reason: format!("the environment variable {var} is not set ({e})"),
                    }
                    .into())
                }
            },
        };
        let http =
            reqwest::Client::builder()
                .build()
                .map_err(|source| SandboxError::RemoteClient {
                    url: url.clone(),
                    source,
                })?;
        Ok(Remote {
            endpoint: format!("{}/run_code", url.trim_end_matches('/')),
            url,
            http,
            key,
            retries: config.retries,
            margin: Duration::from_secs_f64(config.remote_margin_secs),
            retried: AtomicU64::new(0),
        })
    }

    /// The base URL.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Requests sent again so far.
    pub(crate) fn retried(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }

    /// Runs `program` on the server (the caller holds a worker permit) and says how it fared.
    pub(crate) async fn run(
        &self,
        program: &Program,
        limits: &Limits,
    ) -> Result<Execution, SandboxError> {
        if !program.args.is_empty() {
            return Err(self.unsupported("program arguments (run_code has no argv)"));
        }
        let stdin = if program.stdin.is_empty() {
            None
        } else {
            // run_code takes stdin as a JSON string: bytes that are not UTF-8 cannot be sent
            // unchanged, and a changed input would score the program on another test.
            Some(
                std::str::from_utf8(&program.stdin)
                    .map_err(|_| self.unsupported("standard input that is not UTF-8"))?,
            )
        };
        let wall = limits.wall.as_secs_f64();
        let request = RunCodeRequest {
            code: &program.source,
            language: wire_language(program.language),
            compile_timeout: wall,
            run_timeout: wall,
            memory_limit_mb: limits.memory_bytes >> 20,
            stdin,
        };
        let body = serde_json::to_vec(&request).map_err(|source| SandboxError::RemoteGarbage {
            url: self.url.clone(),
            reason: "the request could not be encoded".into(),
            source: Some(source),
        })?;
        let deadline = limits.wall.saturating_add(self.margin);
        let cap = max_body(limits.output_bytes, program);
        let mut attempt: u32 = 0;
        loop {
            let start = Instant::now();
            let outcome = match tokio::time::timeout(deadline, self.attempt(&body, cap)).await {
                Ok(o) => o,
                Err(_) => {
                    return Err(SandboxError::RemoteTimeout {
                        url: self.url.clone(),
                        deadline,
                    })
                }
            };
            let failure = match outcome {
                Ok(Answer::Oversized) => {
                    return Ok(Execution {
                        verdict: Verdict::OutputLimit,
                        stdout: String::new(),
                        stderr: String::new(),
                        exit_code: None,
                        wall: start.elapsed(),
                    })
                }
                Ok(Answer::Body(bytes)) => match self.decode(&bytes, program, limits, start) {
                    Ok(e) => return Ok(e),
                    Err(a) => a,
                },
                Err(a) => a,
            };
            let error = match failure {
                Attempt::Final(e) => return Err(e),
                Attempt::Transient(reason, source) => SandboxError::Remote {
                    url: self.url.clone(),
                    reason,
                    attempts: attempt + 1,
                    source,
                },
                Attempt::ServerFailed(message) => SandboxError::RemoteSandboxError {
                    url: self.url.clone(),
                    message,
                    attempts: attempt + 1,
                },
            };
            if attempt >= self.retries {
                return Err(error);
            }
            let wait = backoff(attempt);
            tracing::warn!(url = %self.url, attempt = attempt + 1, ?wait, error = %error, "remote sandbox request failed; retrying");
            self.retried.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// One request: sent, its status checked and its body read (at most `cap` bytes).
    async fn attempt(&self, body: &[u8], cap: usize) -> Result<Answer, Attempt> {
        let mut request = self
            .http
            .post(&self.endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        // SandboxFusion itself checks no key; gateways in front of it (API gateways, auth
        // proxies) commonly take a bearer token, so that is the convention we send.
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| Attempt::Transient(format!("the request failed: {e}"), Some(e)))?;
        let status = response.status();
        if !status.is_success() {
            let mut text = Vec::new();
            // The body only explains the status; a read error leaves it shorter.
            let _ = read_capped(&mut response, &mut text, ERROR_BODY_BYTES).await;
            let text = String::from_utf8_lossy(&text).trim().to_string();
            let code = status.as_u16();
            return Err(if code == 401 || code == 403 {
                Attempt::Final(SandboxError::RemoteRefused {
                    url: self.url.clone(),
                    status: code,
                    body: text,
                })
            } else if code == 408 || code == 429 || status.is_server_error() {
                Attempt::Transient(format!("HTTP {status}: {text}"), None)
            } else {
                Attempt::Final(SandboxError::Remote {
                    url: self.url.clone(),
                    reason: format!("HTTP {status}: {text}"),
                    attempts: 1,
                    source: None,
                })
            });
        }
        let mut bytes = Vec::new();
        match read_capped(&mut response, &mut bytes, cap).await {
            Ok(true) => Ok(Answer::Body(bytes)),
            Ok(false) => Ok(Answer::Oversized),
            Err(e) => Err(Attempt::Transient(
                format!("the answer was cut off: {e}"),
                Some(e),
            )),
        }
    }

    /// The execution a 2xx body describes, or why it describes none.
    fn decode(
        &self,
        bytes: &[u8],
        program: &Program,
        limits: &Limits,
        start: Instant,
    ) -> Result<Execution, Attempt> {
        let response: RunCodeResponse = serde_json::from_slice(bytes).map_err(|source| {
            Attempt::Final(SandboxError::RemoteGarbage {
                url: self.url.clone(),
                reason: format!(
                    "not a run_code answer: {}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                ),
                source: Some(source),
            })
        })?;
        let message = || response.message.clone().unwrap_or_default();
        if response.status == RunStatus::SandboxError {
            return Err(Attempt::ServerFailed(message()));
        }
        let garbage = |reason: &str| {
            Attempt::Final(SandboxError::RemoteGarbage {
                url: self.url.clone(),
                reason: reason.into(),
                source: None,
            })
        };
        // A compile step that did not succeed decides the verdict: the program never ran.
        let compile_failed = response
            .compile_result
            .as_ref()
            .filter(|c| c.status != CommandRunStatus::Finished || c.return_code != Some(0));
        let (result, compiling) = match (compile_failed, &response.run_result) {
            (Some(c), _) => (c, true),
            (None, Some(r)) => (r, false),
            (None, None) => return Err(garbage("neither a run result nor a failed compile")),
        };
        let (stdout, out_over) = truncate(result.stdout.clone().unwrap_or_default(), limits);
        let (stderr, err_over) = truncate(result.stderr.clone().unwrap_or_default(), limits);
        // The program's own time on the server where it says; else the round trip.
        let wall = result
            .execution_time
            .filter(|t| t.is_finite() && *t >= 0.0 && *t < 86_400.0)
            .map_or_else(|| start.elapsed(), Duration::from_secs_f64);
        let (verdict, exit_code) = match result.status {
            CommandRunStatus::Error => {
                // The server reports this as its own failure (status SandboxError); a server
                // that said otherwise is still not describing a program's failure.
                let m = message();
                let why = if m.is_empty() { stderr.clone() } else { m };
                return Err(Attempt::ServerFailed(why));
            }
            _ if out_over || err_over => (Verdict::OutputLimit, None),
            CommandRunStatus::TimeLimitExceeded => (Verdict::Timeout, None),
            CommandRunStatus::Finished => {
                let Some(code) = result.return_code else {
                    return Err(garbage("a finished command without a return_code"));
                };
                // A process killed by a signal is reported (Python's asyncio) as minus the
                // signal; the local sandbox's convention is 128 + the signal.
                let code = if code < 0 {
                    128_i32.saturating_add(code.saturating_neg())
                } else {
                    code
                };
                let verdict = if compiling {
                    Verdict::SyntaxError
                } else {
                    let expected = program.expected_stdout.as_deref();
                    classify(program.language, code, &stdout, &stderr, expected)
                };
                (verdict, Some(code))
            }
        };
        Ok(Execution {
            verdict,
            stdout,
            stderr,
            exit_code,
            wall,
        })
    }

    fn unsupported(&self, what: &str) -> SandboxError {
        SandboxError::RemoteUnsupported {
            url: self.url.clone(),
            what: what.into(),
        }
    }
}

/// The `language` run_code names each of ours by.
fn wire_language(language: Language) -> &'static str {
    match language {
        Language::Python => "python",
    }
}

/// The wait before retry number `attempt + 1`.
fn backoff(attempt: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(2u32.saturating_pow(attempt.min(16)))
        .min(MAX_BACKOFF)
}

/// `text` cut to the output cap (at a character boundary), and whether it was longer.
fn truncate(mut text: String, limits: &Limits) -> (String, bool) {
    let cap = limits.output_bytes;
    if text.len() <= cap {
        return (text, false);
    }
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    (text, true)
}

/// Reads the body into `buf`, at most `cap` bytes: `Ok(false)` when there was more.
async fn read_capped(
    response: &mut reqwest::Response,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<bool, reqwest::Error> {
    while let Some(chunk) = response.chunk().await? {
        let room = cap.saturating_sub(buf.len());
        if chunk.len() > room {
            buf.extend_from_slice(&chunk[..room]);
            return Ok(false);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(output_bytes: usize) -> Limits {
        Limits {
            output_bytes,
            ..SandboxConfig::default().limits()
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        assert_eq!(backoff(0), Duration::from_millis(200));
        assert_eq!(backoff(1), Duration::from_millis(400));
        assert_eq!(backoff(10), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn output_is_cut_at_a_character_boundary() {
        assert_eq!(truncate("abc".into(), &limits(3)), ("abc".into(), false));
        assert_eq!(truncate("abcd".into(), &limits(3)), ("abc".into(), true));
        // 'é' is two bytes: a cap in its middle keeps neither half.
        assert_eq!(truncate("aé".into(), &limits(2)), ("a".into(), true));
    }

    #[test]
    fn the_request_uses_run_code_s_field_names() {
        let request = RunCodeRequest {
            code: "print(1)",
            language: "python",
            compile_timeout: 2.0,
            run_timeout: 2.0,
            memory_limit_mb: 256,
            stdin: None,
        };
        let v = serde_json::to_value(&request).unwrap();
        assert_eq!(v["memory_limit_MB"], 256);
        assert_eq!(v["run_timeout"], 2.0);
        assert!(v.get("stdin").is_none());
    }

    #[test]
    fn an_unknown_status_does_not_decode() {
        let body = r#"{"status": "Maybe", "message": ""}"#;
        assert!(serde_json::from_str::<RunCodeResponse>(body).is_err());
        let body = r#"{"status": "Failed", "message": "", "run_result": {"status":
            "TimeLimitExceeded", "execution_time": 1.0, "return_code": null, "stdout": "",
            "stderr": null}, "executor_pod_name": null, "files": {}}"#;
        let r: RunCodeResponse = serde_json::from_str(body).unwrap();
        assert_eq!(
            r.run_result.map(|r| r.status),
            Some(CommandRunStatus::TimeLimitExceeded)
        );
    }
}
