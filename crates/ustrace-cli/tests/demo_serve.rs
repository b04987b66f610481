//! `ustrace demo --serve` driven from outside, as the issue asks: through the CLI verbs and
//! through a FUSE mount with plain `sh -c 'echo … > …'` and `cat`, a client of another uid,
//! and kill -9 of the demo while mounted followed by a fresh demo and a fresh mount.

mod common;

use common::DefaultSignals;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ustrace");

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, sig) };
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(
            start.elapsed() < within,
            "process did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A private directory for sockets and mount points, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "ustrace-demo-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn sock(&self) -> PathBuf {
        self.0.join("sock")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `ustrace demo --serve`, killed on drop.
struct Demo {
    child: Child,
    pid: String,
}

impl Demo {
    fn start(scratch: &Scratch) -> Demo {
        let mut child = Command::new(BIN)
            .args(["demo", "--serve", "--workers", "2", "--rate", "100"])
            .env("USTRACE_SOCKET_DIR", scratch.sock())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .default_signals()
            .spawn()
            .unwrap();
        // Ready when its socket appears (the demo's own wording may change).
        let socket = scratch.sock().join(format!("{}.sock", child.id()));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            if let Some(st) = child.try_wait().unwrap() {
                let err = common::stderr_text(&mut child);
                panic!("demo exited {st} before serving: {err}");
            }
            assert!(Instant::now() < deadline, "the demo never served");
            std::thread::sleep(Duration::from_millis(20));
        }
        let lines = BufReader::new(child.stderr.take().unwrap()).lines();
        std::thread::spawn(move || for _ in lines {});
        let pid = child.id().to_string();
        Demo { child, pid }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        signal(&self.child, libc::SIGKILL);
        let _ = self.child.wait();
    }
}

fn cli(scratch: &Scratch, args: &[&str]) -> Output {
    Command::new(BIN)
        .env("USTRACE_SOCKET_DIR", scratch.sock())
        .args(args)
        .output()
        .unwrap()
}

fn cli_ok(scratch: &Scratch, args: &[&str]) -> String {
    let out = cli(scratch, args);
    assert!(
        out.status.success(),
        "ustrace {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_cli_drives_the_served_demo() {
    let scratch = Scratch::new("cli");
    let demo = Demo::start(&scratch);
    let p = demo.pid.as_str();

    let ps = cli_ok(&scratch, &["ps"]);
    let row = ps.lines().find(|l| l.split_whitespace().next() == Some(p));
    assert!(row.is_some_and(|r| r.contains("ustrace")), "{ps}");

    let top = cli_ok(&scratch, &["ls", "-p", p]);
    for name in ["events/", "instances/", "trace", "trace_pipe", "tracing_on"] {
        assert!(
            top.lines().any(|l| l == name),
            "{name} missing from:\n{top}"
        );
    }
    let format = cli_ok(&scratch, &["cat", "-p", p, "events/kv/get/format"]);
    assert!(format.starts_with("name: get\n"), "{format}");

    cli_ok(&scratch, &["write", "-p", p, "events/kv/get/enable", "1"]);
    assert_eq!(
        cli_ok(&scratch, &["cat", "-p", p, "events/kv/get/enable"]).trim(),
        "1"
    );
    let bad = cli(&scratch, &["write", "-p", p, "events/kv/get/enable", "abc"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("Invalid argument"));
    // The filter file is part of the interface: a bad filter is refused with EINVAL.
    let bad = cli(
        &scratch,
        &["write", "-p", p, "events/kv/get/filter", "x > 1"],
    );
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("Invalid argument"), "{err}");

    // Clear, let the workload run, and see its events in trace.
    cli_ok(&scratch, &["write", "-p", p, "trace", ""]);
    std::thread::sleep(Duration::from_millis(300));
    let trace = cli_ok(&scratch, &["cat", "-p", p, "trace"]);
    assert!(trace.starts_with("# tracer: nop"), "{trace}");
    assert!(trace.lines().any(|l| l.contains(" get: key=")), "{trace}");

    // trace_pipe streams until interrupted.
    let mut pipe = Command::new(BIN)
        .env("USTRACE_SOCKET_DIR", scratch.sock())
        .args(["pipe", "-p", p])
        .stdout(Stdio::piped())
        .default_signals()
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(pipe.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        let line = lines.next().unwrap().unwrap();
        assert!(line.contains(": "), "{line}");
    }
    signal(&pipe, libc::SIGINT);
    wait_exit(&mut pipe, Duration::from_secs(3));
}

#[test]
fn a_client_of_another_uid_is_refused() {
    if !is_root() {
        eprintln!("skipped: needs root to run the client as nobody");
        return;
    }
    let scratch = Scratch::new("uid");
    let demo = Demo::start(&scratch);
    let out = Command::new(BIN)
        .env("USTRACE_SOCKET_DIR", scratch.sock())
        .args(["cat", "-p", &demo.pid, "trace"])
        .uid(65534)
        .gid(65534)
        .output();
    let Ok(out) = out else {
        eprintln!("skipped: cannot run the binary as nobody");
        return;
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

/// Starts `ustrace mount` and waits until the directory answers.
fn mount(scratch: &Scratch, pid: &str, dir: &Path) -> Child {
    let mut child = Command::new(BIN)
        .env("USTRACE_SOCKET_DIR", scratch.sock())
        .args(["mount", "-p", pid, dir.to_str().unwrap()])
        .stderr(Stdio::piped())
        .default_signals()
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(mounted(dir) && std::fs::metadata(dir).is_ok()) {
        if let Some(st) = child.try_wait().unwrap() {
            let err = common::stderr_text(&mut child);
            panic!("ustrace mount exited {st}: {err}");
        }
        assert!(Instant::now() < deadline, "the mount did not appear");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn sh(shell: &str, script: &str) -> Output {
    Command::new(shell).arg("-c").arg(script).output().unwrap()
}

fn sh_ok(script: &str) -> String {
    let out = sh("sh", script);
    assert!(
        out.status.success(),
        "`{script}`: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_mounted_demo_behaves_like_the_kernel_tracefs() {
    if !Path::new("/dev/fuse").exists() || !is_root() {
        eprintln!("skipped: FUSE tests need /dev/fuse and root");
        return;
    }
    let scratch = Scratch::new("mount");
    let dir = scratch.0.join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let d = dir.display();
    let demo = Demo::start(&scratch);
    let mut m = mount(&scratch, &demo.pid, &dir);

    let line = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        line.lines()
            .any(|l| l.starts_with(&format!("tracefs {d} "))),
        "{line}"
    );

    sh_ok(&format!("echo 0 > {d}/events/enable"));
    sh_ok(&format!("echo 1 > {d}/events/kv/get/enable"));
    assert_eq!(sh_ok(&format!("cat {d}/events/kv/get/enable")), "1\n");
    sh_ok(&format!("echo > {d}/trace"));
    std::thread::sleep(Duration::from_millis(300));
    let trace = sh_ok(&format!("cat {d}/trace"));
    assert!(trace.lines().any(|l| l.contains(" get: key=")), "{trace}");
    assert!(
        !trace.lines().any(|l| l.contains(" put: key=")),
        "put was disabled:\n{trace}"
    );

    // A bad write shows the kernel's error in the shell.
    let out = sh("bash", &format!("echo 'x > 1' > {d}/events/kv/get/filter"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("write error: Invalid argument"), "{err}");

    // Instances.
    sh_ok(&format!("mkdir {d}/instances/foo"));
    let listing = sh_ok(&format!("ls {d}/instances/foo"));
    assert!(listing.lines().any(|l| l == "trace"), "{listing}");
    sh_ok(&format!("rmdir {d}/instances/foo"));
    assert!(!dir.join("instances/foo").exists());

    // cat trace_pipe blocks, streams, and Ctrl-C ends it.
    let mut cat = Command::new("cat")
        .arg(dir.join("trace_pipe"))
        .stdout(Stdio::piped())
        .default_signals()
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(cat.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains(": "), "{first}");
    signal(&cat, libc::SIGINT);
    wait_exit(&mut cat, Duration::from_secs(3));

    // kill -9 of `ustrace mount` leaves a dead mount; the next mount cleans it up.
    signal(&m, libc::SIGKILL);
    let _ = m.wait();
    assert!(
        std::fs::metadata(&dir).is_err(),
        "a killed mount answers ENOTCONN"
    );
    m = mount(&scratch, &demo.pid, &dir);
    assert_eq!(sh_ok(&format!("cat {d}/events/kv/get/enable")), "1\n");

    // kill -9 of the demo while mounted: the mount goes away by itself...
    drop(demo);
    let status = wait_exit(&mut m, Duration::from_secs(5));
    assert!(status.success());
    let mut err = String::new();
    m.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("went away"), "{err}");
    assert!(!mounted(&dir));

    // ...and a new demo mounts on the same directory.
    let demo = Demo::start(&scratch);
    let mut m = mount(&scratch, &demo.pid, &dir);
    let top = sh_ok(&format!("ls {d}"));
    assert!(top.lines().any(|l| l == "trace_pipe"), "{top}");
    signal(&m, libc::SIGINT);
    assert!(wait_exit(&mut m, Duration::from_secs(5)).success());
    assert!(!mounted(&dir), "still mounted after Ctrl-C");
}
