//! `rollflash-sandbox`: runs untrusted programs — the policy's code — and says what they did.
//!
//! Each execution is a fresh process tree inside Debian's `bubblewrap` (`bwrap`): every
//! namespace unshared (no network, its own PID namespace, no view of host processes), a
//! read-only view of the interpreter's files (`/usr` and the `/lib*`, `/bin` links) and
//! nothing else of the host, a private size-capped tmpfs as its working directory, an
//! unprivileged user, and resource limits (CPU time, address space, processes, file size,
//! open files) set by `prlimit` just before the interpreter starts. The host side adds a
//! wall-time deadline and an output cap, and kills the tree when either is hit. Where
//! `bwrap` cannot start, [`Sandbox::new`] fails with the reason: nothing ever runs
//! unsandboxed.
//!
//! With `kind = "sandbox_fusion"` the programs run on a remote SandboxFusion server instead
//! (its `POST /run_code`, with a deadline, retries and a capped answer), classified into the
//! same verdicts; a server that cannot run a trivial program stops [`Sandbox::new`] naming
//! its URL, and nothing falls back to the local sandbox.
//!
//! [`Sandbox::run`] is async and never blocks the runtime (`tokio::process`); at most
//! `workers` executions run at once. It knows nothing of rewards or data sets: a
//! [`Program`] in, an [`Execution`] with its [`Verdict`] out.

mod config;
mod fusion;
mod program;
mod sandbox;
mod verdict;

pub use config::{ConfigError, Limits, SandboxConfig, SandboxKind};
pub use program::{Language, Program};
pub use sandbox::{Sandbox, SandboxError};
pub use verdict::{Execution, Verdict};
