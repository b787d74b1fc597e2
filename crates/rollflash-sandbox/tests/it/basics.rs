//! Ordinary programs: every verdict the sandbox itself gives, input and expected output.

use rollflash_sandbox::{Program, SandboxConfig, SandboxError, Verdict};

use crate::{run_marked, sandbox, sandbox_with, test_config, EXCLUSIVE};

#[tokio::test]
async fn each_verdict_from_a_program_that_earns_it() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    let cases = [
        ("print('hi')", Verdict::Passed),
        ("import sys; sys.exit(3)", Verdict::RuntimeError),
        ("1/0", Verdict::RuntimeError),
        ("assert 1 == 2", Verdict::WrongAnswer),
        ("def f(:\n  pass", Verdict::SyntaxError),
        ("if True:\nprint(1)", Verdict::SyntaxError),
    ];
    for (source, want) in cases {
        let e = run_marked(&sb, "verdicts", Program::python(source)).await;
        assert_eq!(e.verdict, want, "{source}: {}", crate::brief(&e));
    }
}

#[tokio::test]
async fn stdin_is_given_and_stdout_is_compared_trimmed() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    let double = "n = int(input())\nprint(n * 2, '  ')\nprint()";
    let ok = Program::python(double).with_stdin("21\n").expecting("42");
    assert_eq!(run_marked(&sb, "io", ok).await.verdict, Verdict::Passed);
    let wrong = Program::python(double).with_stdin("21\n").expecting("41\n");
    let e = run_marked(&sb, "io", wrong).await;
    assert_eq!(e.verdict, Verdict::WrongAnswer);
    assert_eq!(e.stdout.trim(), "42");
    assert_eq!(e.exit_code, Some(0));
}

#[tokio::test]
async fn a_program_that_ignores_a_large_stdin_still_ends() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    // More than a pipe holds: the writer must not wait on a program that never reads.
    let p = Program::python("print('done')").with_stdin(vec![b'x'; 4 << 20]);
    assert_eq!(
        run_marked(&sb, "big-stdin", p).await.verdict,
        Verdict::Passed
    );
}

#[tokio::test]
async fn a_sandbox_that_cannot_start_is_an_error_with_the_reason() {
    // It spawns processes too: not while the leak test counts them.
    let _g = EXCLUSIVE.read().await;
    let config = SandboxConfig {
        bwrap: "/nonexistent/bwrap".into(),
        ..test_config()
    };
    let err = sandbox_with_err(config).await;
    assert!(matches!(err, SandboxError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/bwrap"), "{err}");
    let config = SandboxConfig {
        workers: 0,
        ..test_config()
    };
    let err = sandbox_with_err(config).await;
    assert!(err.to_string().contains("sandbox.workers"), "{err}");
    // A bwrap that exists but refuses to run: `/usr/bin/false` stands in for one.
    let config = SandboxConfig {
        bwrap: "/usr/bin/false".into(),
        ..test_config()
    };
    let err = sandbox_with_err(config).await;
    assert!(matches!(err, SandboxError::Unavailable { .. }), "{err:?}");
}

async fn sandbox_with_err(config: SandboxConfig) -> SandboxError {
    match rollflash_sandbox::Sandbox::new(config).await {
        Ok(_) => panic!("the sandbox started"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn executions_beyond_the_pool_wait_for_a_worker() {
    let _g = EXCLUSIVE.read().await;
    let config = SandboxConfig {
        workers: 1,
        ..test_config()
    };
    let Some(sb) = sandbox_with(config).await else {
        return;
    };
    let runs = (0..4).map(|i| {
        let sb = sb.clone();
        async move { sb.run(&Program::python(format!("print({i})"))).await }
    });
    let outs = futures_lite_join(runs).await;
    for (i, e) in outs.into_iter().enumerate() {
        let e = e.unwrap();
        assert_eq!(e.verdict, Verdict::Passed);
        assert_eq!(e.stdout.trim(), i.to_string());
    }
}

/// Joins futures without another dependency: each on a task of its own.
async fn futures_lite_join<F, T>(futs: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}
