//! Hostile programs: each is contained, gets its verdict, and leaves no process behind
//! (`run_marked` scans `/proc` for the test's marker after every run). The table in
//! RELIABILITY.md lists them.

use std::io::ErrorKind;
use std::net::TcpListener;

use rollflash_sandbox::{Program, Verdict};

use crate::{marker, repo_manifest, run_marked, sandbox, EXCLUSIVE};

#[tokio::test]
async fn host_secrets_and_project_files_are_not_visible() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    let manifest = repo_manifest().canonicalize().unwrap();
    assert!(manifest.exists());
    let source = format!(
        r#"
import os
seen = []
for p in ["/etc/shadow", "/etc/passwd", {manifest:?}, "/root", "/work", "/home", "/proc/1/root/etc/shadow"]:
    try:
        if os.path.isdir(p):
            seen.append((p, os.listdir(p)))
        else:
            seen.append((p, open(p).read()[:40]))
    except OSError as e:
        pass
print("SEEN", seen)
print("ROOT", sorted(os.listdir("/")))
"#,
        manifest = manifest.display().to_string()
    );
    let e = run_marked(&sb, "secrets", Program::python(source)).await;
    assert_eq!(e.verdict, Verdict::Passed, "{}", crate::brief(&e));
    assert!(e.stdout.contains("SEEN []"), "{}", e.stdout);
    // Only the interpreter's tree and the sandbox's own mounts.
    for name in ["etc", "root", "work", "home"] {
        assert!(!e.stdout.contains(&format!("'{name}'")), "{}", e.stdout);
    }
    // Reading it without catching the error is a runtime error, not a crash of ours.
    let e = run_marked(
        &sb,
        "secrets",
        Program::python("print(open('/etc/shadow').read())"),
    )
    .await;
    assert_eq!(e.verdict, Verdict::RuntimeError);
    assert!(e.stderr.contains("FileNotFoundError"), "{}", e.stderr);
}

#[tokio::test]
async fn writes_outside_the_working_directory_fail_and_nothing_reaches_the_host() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    let host_file = std::env::temp_dir().join(marker("written"));
    let source = format!(
        r#"
import os
ok = []
for p in ["/usr/pwned", "/box/pwned", "/pwned", "/proc/pwned", "/dev/pwned", {host:?}]:
    try:
        with open(p, "w") as f:
            f.write("x")
        ok.append(p)
    except OSError:
        pass
print("WROTE", ok)
"#,
        host = host_file.display().to_string()
    );
    let e = run_marked(&sb, "writes", Program::python(source)).await;
    assert_eq!(e.verdict, Verdict::Passed, "{}", crate::brief(&e));
    // The host's temporary directory path inside the sandbox is its private tmpfs: the write
    // succeeds there and is gone with it.
    let expected = format!("WROTE [{:?}]", host_file.display().to_string()).replace('"', "'");
    assert_eq!(e.stdout.trim(), expected);
    assert!(!host_file.exists());
    // The private tmpfs is capped: filling it fails inside.
    let fill = "open('big', 'wb').write(b'0' * (64 << 20))";
    let e = run_marked(&sb, "writes", Program::python(fill)).await;
    assert!(
        matches!(e.verdict, Verdict::RuntimeError | Verdict::Memory),
        "{e:?}"
    );
}

#[tokio::test]
async fn no_network_not_even_the_host_s_loopback() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let source = format!(
        r#"
import socket
for addr in [("127.0.0.1", {port}), ("1.1.1.1", 80), ("::1", {port})]:
    try:
        socket.create_connection(addr, timeout=0.5)
        print("CONNECTED", addr)
    except OSError as e:
        print("BLOCKED", type(e).__name__)
"#
    );
    let e = run_marked(&sb, "network", Program::python(source)).await;
    assert_eq!(e.verdict, Verdict::Passed, "{}", crate::brief(&e));
    assert!(!e.stdout.contains("CONNECTED"), "{}", e.stdout);
    assert_eq!(e.stdout.matches("BLOCKED").count(), 3, "{}", e.stdout);
    match listener.accept() {
        Err(err) if err.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host listener was reached: {other:?}"),
    }
}

#[tokio::test]
async fn a_fork_bomb_is_held_at_the_process_limit() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    // Counts how many forks succeed before the limit (16 with the sandbox's init and the
    // interpreter) refuses one; the children wait on a pipe that never gets written.
    let counted = r#"
import os
r, w = os.pipe()
n = 0
try:
    while n < 10000:
        if os.fork() == 0:
            os.read(r, 1)
            os._exit(0)
        n += 1
except OSError as e:
    print("FORKS", n, type(e).__name__)
"#;
    let e = run_marked(&sb, "forkbomb", Program::python(counted)).await;
    assert_eq!(e.verdict, Verdict::Passed, "{}", crate::brief(&e));
    let forks: usize = e.stdout.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(forks < 16, "{}", e.stdout);
    // The classic bomb never stops by itself: the deadline ends it, and takes every process.
    let bomb =
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n";
    let e = run_marked(&sb, "forkbomb", Program::python(bomb)).await;
    assert_eq!(e.verdict, Verdict::Timeout, "{}", crate::brief(&e));
}

#[tokio::test]
async fn allocating_10_gb_fails_as_memory() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    let e = run_marked(
        &sb,
        "memory",
        Program::python("x = bytearray(10 * 1024**3)"),
    )
    .await;
    assert_eq!(e.verdict, Verdict::Memory, "{}", crate::brief(&e));
    // Growing step by step reaches the same limit.
    let grow = "xs = []\nwhile True:\n    xs.append(bytearray(16 << 20))";
    let e = run_marked(&sb, "memory", Program::python(grow)).await;
    assert_eq!(e.verdict, Verdict::Memory, "{}", crate::brief(&e));
}

#[tokio::test]
async fn spinning_and_sleeping_past_the_deadline_time_out() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    let e = run_marked(&sb, "spin", Program::python("while True:\n    pass")).await;
    assert_eq!(e.verdict, Verdict::Timeout, "{}", crate::brief(&e));
    // Catching SIGXCPU does not help: the hard limit's SIGKILL follows.
    let stubborn =
        "import signal\nsignal.signal(signal.SIGXCPU, lambda *a: None)\nwhile True:\n    pass";
    let e = run_marked(&sb, "spin", Program::python(stubborn)).await;
    assert_eq!(e.verdict, Verdict::Timeout, "{}", crate::brief(&e));
    // Sleeping uses no CPU: only the wall deadline catches it.
    let e = run_marked(
        &sb,
        "sleep",
        Program::python("import time\ntime.sleep(3600)"),
    )
    .await;
    assert_eq!(e.verdict, Verdict::Timeout, "{}", crate::brief(&e));
    assert_eq!(e.exit_code, None);
}

#[tokio::test]
async fn printing_a_gigabyte_stops_at_the_output_cap() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    let source =
        "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)";
    let e = run_marked(&sb, "print", Program::python(source)).await;
    assert_eq!(e.verdict, Verdict::OutputLimit);
    assert_eq!(e.stdout.len(), 64 * 1024);
    // stderr has the same cap.
    let source = "import sys\nwhile True:\n    sys.stderr.write('y' * 4096)";
    let e = run_marked(&sb, "print", Program::python(source)).await;
    assert_eq!(e.verdict, Verdict::OutputLimit);
}

#[tokio::test]
async fn background_children_die_with_the_program() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    // A forked child in a session of its own, a daemonised grandchild, and a `Popen` child
    // carrying the marker in its own command line; the program then exits at once.
    let source = r#"
import os, subprocess, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(3600)
    os._exit(0)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", sys.argv[1]], start_new_session=True)
print("LEFT")
"#;
    let e = run_marked(&sb, "background", Program::python(source)).await;
    assert_eq!(e.verdict, Verdict::Passed, "{}", crate::brief(&e));
    assert_eq!(e.stdout.trim(), "LEFT");
}

#[tokio::test]
async fn signals_to_the_parent_and_everyone_reach_nothing_outside() {
    let _g = EXCLUSIVE.read().await;
    let Some(sb) = sandbox().await else { return };
    let me = std::process::id();
    let source = format!(
        r#"
import os, signal
results = []
for target in [os.getppid(), 1, {me}, -1]:
    try:
        os.kill(target, signal.SIGKILL)
        results.append((target, "sent"))
    except OSError as e:
        results.append((target, type(e).__name__))
print("ALIVE", os.getppid(), results)
"#
    );
    let e = run_marked(&sb, "signals", Program::python(source)).await;
    // Its parent is the sandbox's init, which ignores signals from inside its namespace; the
    // test process is not in that namespace at all.
    assert_eq!(e.verdict, Verdict::Passed, "{}", crate::brief(&e));
    assert!(e.stdout.starts_with("ALIVE 1 "), "{}", e.stdout);
    let e = run_marked(&sb, "signals", Program::python("print('next')")).await;
    assert_eq!(e.verdict, Verdict::Passed);
}
