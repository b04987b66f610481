//! The `ustrace` verbs that reach another process, run as a user runs them: the real binary
//! against a tracefs served by this test process (an in-memory one, so these tests do not
//! depend on the workload), found through `USTRACE_SOCKET_DIR`; the test of a traced process
//! that dies runs `ustrace demo --serve` as that process.

mod common;

use common::DefaultSignals;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ustrace_ctl::memfs::MemFs;
use ustrace_ctl::server::{self, ServerConfig, ServerHandle};

struct Served {
    fs: Arc<MemFs>,
    _handle: ServerHandle,
    sock_dir: PathBuf,
    root: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn serve() -> Served {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let root = std::env::temp_dir().join(format!(
        "ustrace-cli-test-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let sock_dir = root.join("sock");
    let fs = Arc::new(MemFs::sample());
    let config = ServerConfig {
        socket_dir: Some(sock_dir.clone()),
        ..Default::default()
    };
    let handle = server::serve_with(fs.clone(), config).unwrap();
    Served {
        fs,
        _handle: handle,
        sock_dir,
        root,
    }
}

fn ustrace(s: &Served) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ustrace"));
    c.env("USTRACE_SOCKET_DIR", &s.sock_dir);
    c
}

fn run(s: &Served, args: &[&str]) -> Output {
    ustrace(s).args(args).output().unwrap()
}

fn ok(s: &Served, args: &[&str]) -> String {
    let out = run(s, args);
    assert!(
        out.status.success(),
        "ustrace {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn pid() -> String {
    std::process::id().to_string()
}

#[test]
fn ps_lists_this_process() {
    let s = serve();
    let out = ok(&s, &["ps", "--sockets"]);
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&pid()))
        .unwrap_or_else(|| panic!("pid {} not listed:\n{out}", pid()));
    assert!(line.contains(s.sock_dir.to_str().unwrap()), "{line}");
}

#[test]
fn cat_write_ls_round_trip() {
    let s = serve();
    let p = pid();
    assert_eq!(ok(&s, &["cat", "-p", &p, "trace"]), "# tracer: nop\n");
    assert_eq!(
        ok(&s, &["ls", "-p", &p]),
        "events/\ninstances/\ntrace\ntrace_pipe\ntracing_on\n"
    );
    assert_eq!(ok(&s, &["ls", "-p", &p, "events/sched"]), "sched_switch/\n");

    let enable = "events/sched/sched_switch/enable";
    ok(&s, &["write", "-p", &p, enable, "1"]);
    assert_eq!(s.fs.content(enable).unwrap(), b"1");
    ok(&s, &["write", "-p", &p, "trace", "more\n", "--append"]);
    assert_eq!(ok(&s, &["cat", "-p", &p, "trace"]), "# tracer: nop\nmore\n");
    ok(&s, &["write", "-p", &p, "trace", ""]);
    assert_eq!(ok(&s, &["cat", "-p", &p, "trace"]), "");
}

#[test]
fn errors_go_to_stderr_with_a_nonzero_exit() {
    let s = serve();
    let p = pid();
    let out = run(
        &s,
        &[
            "write",
            "-p",
            &p,
            "events/sched/sched_switch/filter",
            "x > 1",
        ],
    );
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Invalid argument"), "{err}");

    let out = run(&s, &["cat", "-p", &p, "no/such/file"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file or directory"));

    let out = run(&s, &["cat", "-p", "4194304", "trace"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no process with pid 4194304"));

    let out = run(&s, &["cat", "-p", &p]);
    assert!(!out.status.success(), "a missing argument is a usage error");
    let help = ok(&s, &["--help"]);
    assert!(
        help.contains("Examples:") && help.contains("ustrace mount -p"),
        "{help}"
    );
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(
            start.elapsed() < within,
            "process did not exit in {within:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn sigint(child: &Child) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
}

#[test]
fn pipe_streams_until_interrupted() {
    let s = serve();
    let mut child = ustrace(&s)
        .args(["pipe", "-p", &pid()])
        .stdout(Stdio::piped())
        .default_signals()
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    std::thread::sleep(Duration::from_millis(200));
    s.fs.push("trace_pipe", b"one\n").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "one");
    s.fs.push("trace_pipe", b"two\n").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "two");
    assert!(child.try_wait().unwrap().is_none(), "pipe ended by itself");
    sigint(&child);
    wait_exit(&mut child, Duration::from_secs(3));
}

#[test]
fn another_uid_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run the client as nobody");
        return;
    }
    let s = serve();
    let out = ustrace(&s)
        .args(["cat", "-p", &pid(), "trace"])
        .uid(65534)
        .gid(65534)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: cannot run the test binary as nobody: {e}");
            return;
        }
    };
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Permission denied"), "{err}");
}

fn mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    mounts
        .lines()
        .any(|l| l.starts_with("tracefs ") && l.split(' ').nth(1) == dir.to_str())
}

fn sh(script: &str) -> Output {
    Command::new("sh").arg("-c").arg(script).output().unwrap()
}

#[test]
fn mount_serves_the_shell_until_interrupted_and_recovers_from_kill() {
    // SAFETY: geteuid has no preconditions.
    if !Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs /dev/fuse and root");
        return;
    }
    let s = serve();
    let dir = s.root.join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let start_mount = || {
        let mut child = ustrace(&s)
            .args(["mount", "-p", &pid(), dir.to_str().unwrap()])
            .stderr(Stdio::piped())
            .default_signals()
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        // A dead mount left by a killed server is listed too, but answers ENOTCONN.
        while !(mounted(&dir) && std::fs::metadata(&dir).is_ok()) {
            if let Some(st) = child.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
                panic!("ustrace mount exited {st}: {err}");
            }
            assert!(Instant::now() < deadline, "mount did not appear");
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    };
    let d = dir.display();
    let mut child = start_mount();
    let out = sh(&format!(
        "echo 1 > {d}/events/sched/sched_switch/enable && cat {d}/trace"
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "# tracer: nop\n");
    assert_eq!(
        s.fs.content("events/sched/sched_switch/enable").unwrap(),
        b"1\n"
    );
    sigint(&child);
    assert!(wait_exit(&mut child, Duration::from_secs(5)).success());
    assert!(!mounted(&dir), "still mounted after Ctrl-C");

    // kill -9 leaves a dead mount; the next `ustrace mount` detaches it and serves again.
    let mut child = start_mount();
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    assert!(
        std::fs::metadata(&dir).is_err(),
        "a killed mount should leave ENOTCONN"
    );
    let mut child = start_mount();
    let out = sh(&format!("mkdir {d}/instances/foo && ls {d}/instances"));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "foo\n");
    sigint(&child);
    assert!(wait_exit(&mut child, Duration::from_secs(5)).success());
    assert!(!mounted(&dir));
}

#[test]
fn mount_goes_away_when_the_traced_process_dies() {
    // SAFETY: geteuid has no preconditions.
    if !Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs /dev/fuse and root");
        return;
    }
    let s = serve();
    // The traced process is a real one that serves its tracefs: `ustrace demo --serve`.
    let child_dir = s.root.join("child-sock");
    let mut traced = Command::new(env!("CARGO_BIN_EXE_ustrace"))
        .args(["demo", "--serve", "--workers", "1", "--rate", "100"])
        .env("USTRACE_SOCKET_DIR", &child_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .default_signals()
        .spawn()
        .unwrap();
    let socket = child_dir.join(format!("{}.sock", traced.id()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            traced.try_wait().unwrap().is_none(),
            "ustrace demo --serve exited before serving"
        );
        assert!(Instant::now() < deadline, "ustrace demo never served");
        std::thread::sleep(Duration::from_millis(20));
    }

    let dir = s.root.join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mut mount = Command::new(env!("CARGO_BIN_EXE_ustrace"))
        .env("USTRACE_SOCKET_DIR", &child_dir)
        .args([
            "mount",
            "-p",
            &traced.id().to_string(),
            dir.to_str().unwrap(),
        ])
        .stderr(Stdio::piped())
        .default_signals()
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(mounted(&dir) && std::fs::metadata(&dir).is_ok()) {
        assert!(
            mount.try_wait().unwrap().is_none(),
            "ustrace mount exited early"
        );
        assert!(Instant::now() < deadline, "mount did not appear");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = sh(&format!("cat {}/tracing_on", dir.display()));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n");

    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(traced.id() as i32, libc::SIGKILL) };
    let _ = traced.wait();
    let status = wait_exit(&mut mount, Duration::from_secs(5));
    assert!(status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut mount.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("went away"), "{err}");
    assert!(!mounted(&dir), "mount left behind by a dead process");
}

/// No `#[test]` here is a child role that returns at once when the harness runs it, which
/// would count as a pass that checked nothing: child processes are real binaries.
#[test]
fn every_listed_test_is_a_test() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--list", "--format", "terse"])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(list.contains("ps_lists_this_process: test"), "{list}");
    let roles: Vec<_> = list.lines().filter(|l| l.contains("child")).collect();
    assert!(roles.is_empty(), "child roles listed as tests: {roles:?}");
}
