//! A thousand executions in a row, of every hostile kind, leave processes, open files and
//! temporary space as they were.

use rollflash_sandbox::{Program, SandboxConfig, Verdict};

use crate::{children, sandbox_with, test_config, EXCLUSIVE};

/// Open descriptors of this process that an execution creates: pipes and process handles.
/// (Other kinds — the runtimes of tests waiting for the lock — are not ours to count.)
fn execution_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|t| {
            let t = t.to_string_lossy();
            t.starts_with("pipe:") || t.contains("pidfd")
        })
        .count()
}

fn scratch_entries(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[tokio::test]
async fn a_thousand_executions_leave_the_machine_as_found() {
    let _g = EXCLUSIVE.write().await;
    let scratch = std::env::temp_dir().join(format!("rfsbx-leaks-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let config = SandboxConfig {
        scratch_dir: Some(scratch.clone()),
        wall_secs: 1.0,
        ..test_config()
    };
    let Some(sb) = sandbox_with(config).await else {
        std::fs::remove_dir_all(&scratch).unwrap();
        return;
    };
    // One run first: the runtime's process driver opens what it keeps on first use.
    sb.run(&Program::python("print(1)")).await.unwrap();
    let (procs, fds, files) = (children().len(), execution_fds(), scratch_entries(&scratch));
    let kinds = [
        ("print(sum(range(10)))", Verdict::Passed),
        (
            "import os\nif os.fork() == 0:\n    import time; time.sleep(60)\n",
            Verdict::Passed,
        ),
        (
            "import sys\nwhile True: sys.stdout.write('x' * 65536)",
            Verdict::OutputLimit,
        ),
        (
            "open('f', 'wb').write(b'1' * (1 << 20))\n1/0",
            Verdict::RuntimeError,
        ),
        ("x = bytearray(10 * 1024**3)", Verdict::Memory),
    ];
    // Two at a time, the pool's two workers, as a reward's executions run.
    for i in (0..1000).step_by(2) {
        let (a, b) = (kinds[i % kinds.len()], kinds[(i + 1) % kinds.len()]);
        let (pa, pb) = (Program::python(a.0), Program::python(b.0));
        let (ea, eb) = tokio::join!(sb.run(&pa), sb.run(&pb));
        for (j, e, want) in [(i, ea.unwrap(), a.1), (i + 1, eb.unwrap(), b.1)] {
            assert_eq!(e.verdict, want, "run {j}: {}", crate::brief(&e));
        }
    }
    // Timeouts cost a deadline each: a few, not 40.
    for _ in 0..3 {
        let e = sb
            .run(&Program::python("import time\ntime.sleep(60)"))
            .await
            .unwrap();
        assert_eq!(e.verdict, Verdict::Timeout);
    }
    assert_eq!(children().len(), procs, "child processes");
    assert_eq!(execution_fds(), fds, "pipes and process handles");
    assert_eq!(scratch_entries(&scratch), files, "scratch directories");
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// Executions dropped mid-flight (a trajectory aborted at the end of a run), at moments from
/// before the sandbox is set up to while the program runs, leave no process of theirs: the
/// namespace's init is killed with our `bwrap` (found before: sleeping inits left behind).
#[tokio::test]
async fn cancelled_executions_leave_no_process() {
    let _g = EXCLUSIVE.write().await;
    let Some(sb) = sandbox_with(test_config()).await else {
        return;
    };
    let marker = crate::marker("cancelled");
    for i in 0..40u64 {
        let program =
            Program::python("import time\ntime.sleep(30)").with_args(vec![marker.clone()]);
        let sb = sb.clone();
        let task = tokio::spawn(async move { sb.run(&program).await });
        // 0 to 39 ms: before, during and after the sandbox's set-up.
        tokio::time::sleep(std::time::Duration::from_millis(i)).await;
        task.abort();
        let _ = task.await;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = crate::processes_with(&marker);
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "processes left by cancelled executions: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
