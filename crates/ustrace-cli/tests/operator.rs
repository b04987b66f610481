//! The operator's first hour (issue 18): `ps` columns, `write` errors with their `error_log`
//! entry, help that works, completions and man pages, the demo's closing line, and `mount`
//! refusing a target it must not use. The real binary against this test process's own
//! tracefs (served through `USTRACE_SOCKET_DIR`), or against `ustrace demo --serve`.

mod common;

use common::DefaultSignals;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use ustrace::{FileSystem, OpenFlags};
use ustrace_ctl::server::{self, ServerConfig, ServerHandle};

const BIN: &str = env!("CARGO_BIN_EXE_ustrace");

ustrace::trace_event! {
    /// An event of this test, so the served tracefs has one to count and enable.
    pub fn optest::tick(n: u64) {
        n: u64 = n,
    }
    print "n=%llu", n;
}

/// A private directory, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "ustrace-op-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// This process's real tracefs, served once for every test here.
fn served() -> &'static (ServerHandle, PathBuf) {
    static SERVED: OnceLock<(ServerHandle, PathBuf)> = OnceLock::new();
    SERVED.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ustrace-op-sock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = ServerConfig {
            socket_dir: Some(dir.clone()),
            ..Default::default()
        };
        let handle = server::serve_with(Arc::new(ustrace::TraceFs), config).unwrap();
        (handle, dir)
    })
}

fn ustrace(args: &[&str]) -> Output {
    Command::new(BIN)
        .env("USTRACE_SOCKET_DIR", &served().1)
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = ustrace(args);
    assert!(
        out.status.success(),
        "ustrace {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn read(path: &str) -> String {
    let mut f = ustrace::tracefs().open(path, OpenFlags::READ).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf, None).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(out).unwrap()
}

fn write(path: &str, text: &str) {
    let mut f = ustrace::tracefs().open(path, OpenFlags::TRUNCATE).unwrap();
    f.write(text.as_bytes()).unwrap();
}

fn lines(text: &str) -> usize {
    text.lines().filter(|l| !l.trim().is_empty()).count()
}

#[test]
fn ps_shows_user_command_line_and_event_counts() {
    tick::trace(1);
    write("events/optest/tick/enable", "1");
    let me = std::process::id().to_string();
    let out = ok(&["ps"]);
    let header = out.lines().next().unwrap();
    for column in ["PID", "USER", "EVENTS", "ENABLED", "COMMAND"] {
        assert!(header.contains(column), "{header}");
    }
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&me))
        .unwrap_or_else(|| panic!("pid {me} not listed:\n{out}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    // SAFETY: geteuid has no preconditions.
    let user = if unsafe { libc::geteuid() } == 0 {
        "root".to_owned()
    } else {
        std::env::var("USER").unwrap_or_default()
    };
    if !user.is_empty() {
        assert_eq!(cols[1], user, "{line}");
    }
    let events = lines(&read("available_events"));
    let enabled = lines(&read("set_event"));
    assert!(enabled >= 1, "the test enabled optest:tick");
    assert_eq!(cols[2], events.to_string(), "{line}");
    assert_eq!(cols[3], enabled.to_string(), "{line}");
    // The full command line: this test binary's path, then its arguments.
    let exe = std::env::args().next().unwrap();
    assert_eq!(cols[4], exe, "{line}");
    let with_sockets = ok(&["ps", "--sockets"]);
    assert!(
        with_sockets.contains(served().0.socket_path().to_str().unwrap()),
        "{with_sockets}"
    );
}

#[test]
fn a_rejected_write_prints_its_error_log_entry() {
    let me = std::process::id().to_string();
    let out = ustrace(&["write", "-p", &me, "events/optest/tick/filter", "n >> 3"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Invalid argument"), "{err}");
    let log = read("error_log");
    let entry: Vec<&str> = log.lines().rev().take(3).collect();
    // The last entry: "[ts] ...: error: MESSAGE", "  Command: n >> 3", the caret line.
    let (caret, command, first) = (entry[0], entry[1], entry[2]);
    assert!(command.contains("Command: n >> 3"), "{log}");
    let message = first.split("] ").nth(1).unwrap();
    assert!(err.contains(message), "stderr lacks {message:?}:\n{err}");
    assert!(err.contains(command), "{err}");
    assert!(err.contains(caret), "{err}");
    assert!(err.contains(caret.trim()), "{err}");
    // Only the new entry: one Command line, however many the log holds.
    let out = ustrace(&["write", "-p", &me, "events/optest/tick/filter", "n >> 4"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("Command:").count(), 1, "{err}");
    assert!(err.contains("Command: n >> 4"), "{err}");
    // A refusal that logs nothing prints the errno alone.
    let out = ustrace(&["write", "-p", &me, "set_event", "nosuch:nosuch"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("error_log"), "{err}");
}

#[test]
fn help_is_a_verb_with_help() {
    let out = ok(&["help", "--help"]);
    assert!(out.contains("Usage: ustrace help"), "{out}");
    assert!(ok(&["help", "mount"]).contains("Usage: ustrace mount"));
    assert!(ok(&["help"]).contains("Usage: ustrace <COMMAND>"));
    let out = ustrace(&["help", "nosuch"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no verb named"));
}

#[test]
fn completions_and_man_pages_come_from_the_definitions() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef ustrace"),
        ("fish", "complete -c ustrace"),
    ] {
        let out = ok(&["completions", shell]);
        assert!(out.contains(marker), "{shell}: {out}");
        for verb in ["mount", "pipe", "completions", "allow-group"] {
            assert!(out.contains(verb), "{shell} lacks {verb}");
        }
    }
    let scratch = Scratch::new("man");
    let dir = scratch.0.join("man1");
    let listed = ok(&["man", dir.to_str().unwrap()]);
    for page in ["ustrace.1", "ustrace-mount.1", "ustrace-write.1"] {
        let path = dir.join(page);
        assert!(listed.contains(path.to_str().unwrap()), "{listed}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page}");
    }
    let mount = std::fs::read_to_string(dir.join("ustrace-mount.1")).unwrap();
    assert!(mount.contains("allow\\-group"), "{mount}");
}

/// A running `ustrace demo --serve`, killed on drop.
struct Demo {
    child: Child,
    _scratch: Scratch,
    sock: PathBuf,
}

impl Demo {
    fn start() -> Demo {
        let scratch = Scratch::new("demo");
        let sock = scratch.0.join("sock");
        let mut child = Command::new(BIN)
            .args(["demo", "--serve", "--workers", "1", "--rate", "100"])
            .args(["--seconds", "60"])
            .env("USTRACE_SOCKET_DIR", &sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .default_signals()
            .spawn()
            .unwrap();
        let socket = sock.join(format!("{}.sock", child.id()));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            assert!(child.try_wait().unwrap().is_none(), "demo exited early");
            assert!(Instant::now() < deadline, "demo never served");
            std::thread::sleep(Duration::from_millis(20));
        }
        Demo {
            child,
            _scratch: scratch,
            sock,
        }
    }

    fn ustrace(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .env("USTRACE_SOCKET_DIR", &self.sock)
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn every_path_in_cat_help_exists_in_the_demo() {
    let demo = Demo::start();
    let pid = demo.child.id().to_string();
    let help = String::from_utf8(demo.ustrace(&["cat", "--help"]).stdout).unwrap();
    let paths: Vec<&str> = help
        .split(|c: char| c.is_whitespace() || c == '`' || c == ',')
        .filter(|w| w.starts_with("events/") || *w == "trace")
        .collect();
    assert!(paths.len() >= 3, "{help}");
    for path in paths {
        let out = demo.ustrace(&["cat", "-p", &pid, path]);
        assert!(
            out.status.success(),
            "`ustrace cat --help` names {path}, which fails: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_demo_ends_with_its_buffer_stats() {
    let out = Command::new(BIN)
        .args(["demo", "--seconds", "0.2", "--workers", "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let last = text.lines().last().unwrap();
    // The process is gone after this line: it must carry the numbers, not point at files.
    let holds: u64 = last
        .split("holds ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no event count in {last:?}"));
    assert!(holds > 0, "{last}");
    let body = text.lines().filter(|l| !l.starts_with('#')).count();
    assert!(body > 0);
}

fn mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    mounts
        .lines()
        .any(|l| l.starts_with("tracefs ") && l.split(' ').nth(1) == dir.to_str())
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn mount_refuses_a_mounted_nonempty_or_file_target_and_makes_a_missing_one() {
    // SAFETY: geteuid has no preconditions.
    if !Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs /dev/fuse and root");
        return;
    }
    let me = std::process::id().to_string();
    let scratch = Scratch::new("mnt");
    let dir = scratch.0.join("not-yet");
    let mut first = Command::new(BIN)
        .env("USTRACE_SOCKET_DIR", &served().1)
        .args(["mount", "-p", &me, dir.to_str().unwrap()])
        .stderr(Stdio::piped())
        .default_signals()
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(mounted(&dir) && std::fs::metadata(&dir).is_ok()) {
        if first.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let _ = first.kill();
            let out = first.wait_with_output().unwrap();
            panic!(
                "mount did not appear: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // A second mount on the same directory is refused and leaves the first alone.
    let out = ustrace(&["mount", "-p", &me, dir.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already a ustrace mount"), "{err}");
    assert!(mounted(&dir));
    assert_eq!(
        std::fs::read_to_string(dir.join("tracing_on")).unwrap(),
        "1\n"
    );

    let full = scratch.0.join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), "x").unwrap();
    let out = ustrace(&["mount", "-p", &me, full.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
    let out = ustrace(&["mount", "-p", &me, full.join("x").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
    assert!(!mounted(&full));

    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(first.id() as i32, libc::SIGINT) };
    assert!(wait_exit(&mut first, Duration::from_secs(10)).success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut first.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("created"), "{err}");
    assert!(!mounted(&dir));
    assert!(!dir.exists(), "the directory it made is removed again");
}

/// The `tracing_mark_write` lines of this process's trace that carry `text`.
fn marker_lines(text: &str) -> Vec<String> {
    read("trace")
        .lines()
        .filter(|l| l.contains("tracing_mark_write") && l.contains(text))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_marker_written_over_the_socket_names_the_writer() {
    let me = std::process::id().to_string();
    let mut child = Command::new(BIN)
        .env("USTRACE_SOCKET_DIR", &served().1)
        .args(["write", "-p", &me, "trace_marker", "hello-over-the-socket"])
        .default_signals()
        .spawn()
        .unwrap();
    let writer = child.id();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    assert!(status.success());
    let lines = marker_lines("hello-over-the-socket");
    assert_eq!(lines.len(), 1, "{lines:?}");
    // `ustrace write` (comm `ustrace`) wrote it, not a server thread of this process.
    assert!(
        lines[0]
            .trim_start()
            .starts_with(&format!("ustrace-{writer} ")),
        "{}",
        lines[0]
    );
    assert!(read("saved_cmdlines").contains(&format!("{writer} ustrace\n")));
    // Acting for a task that does not exist is refused, and nothing else changes.
    let mut client = ustrace_ctl::client::Client::connect_path(served().0.socket_path()).unwrap();
    let err = client.act_for(u32::MAX - 1).unwrap_err();
    assert_eq!(err.errno(), ustrace::Errno(libc::ESRCH), "{err}");
    client.act_for(writer).unwrap_err();
    client.act_for(0).unwrap();
}

#[test]
fn a_marker_written_through_the_mount_names_the_shell_that_wrote() {
    // SAFETY: geteuid has no preconditions.
    if !Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs /dev/fuse and root");
        return;
    }
    let me = std::process::id().to_string();
    let scratch = Scratch::new("marker");
    let dir = scratch.0.join("mnt");
    let mut mount = Command::new(BIN)
        .env("USTRACE_SOCKET_DIR", &served().1)
        .args(["mount", "-p", &me, dir.to_str().unwrap()])
        .stderr(Stdio::null())
        .default_signals()
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(mounted(&dir) && std::fs::metadata(&dir).is_ok()) {
        if mount.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let _ = mount.kill();
            let _ = mount.wait();
            panic!("mount did not appear");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut sh = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo hello-through-fuse > {}/trace_marker",
            dir.display()
        ))
        .default_signals()
        .spawn()
        .unwrap();
    let writer = sh.id();
    let status = wait_exit(&mut sh, Duration::from_secs(30));
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(mount.id() as i32, libc::SIGINT) };
    assert!(wait_exit(&mut mount, Duration::from_secs(10)).success());
    assert!(status.success());
    let lines = marker_lines("hello-through-fuse");
    assert_eq!(lines.len(), 1, "{lines:?}");
    // The shell's echo is a builtin: the shell itself wrote.
    assert!(
        lines[0].trim_start().starts_with(&format!("sh-{writer} ")),
        "{}",
        lines[0]
    );
}

/// Runs `cmd` as uid/gid 65534 when this test runs as root (else as the user it runs as).
fn as_unprivileged(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // SAFETY: runs in the child before exec; setgroups/setgid/setuid are
        // async-signal-safe and use no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(65534) != 0
                    || libc::setuid(65534) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd
}

#[test]
fn a_user_mounts_through_fusermount3_or_is_told_the_real_cause() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse on this machine");
        return;
    }
    let scratch = Scratch::new("user");
    let c = |p: &Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: chown(2) on a path we made; a non-root run owns it already (then it fails).
    unsafe { libc::chown(c(&scratch.0).as_ptr(), 65534, 65534) };
    let sock = scratch.0.join("sock");
    let mut demo = as_unprivileged(
        Command::new(BIN)
            .args(["demo", "--serve", "--workers", "1", "--rate", "100"])
            .args(["--seconds", "60"])
            .env("USTRACE_SOCKET_DIR", &sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .default_signals(),
    )
    .spawn()
    .unwrap();
    let socket = sock.join(format!("{}.sock", demo.id()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        if demo.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let _ = demo.kill();
            let _ = demo.wait();
            panic!("the unprivileged demo never served");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let dir = scratch.0.join("mnt");
    let mut mount = as_unprivileged(
        Command::new(BIN)
            .env("USTRACE_SOCKET_DIR", &sock)
            .args(["mount", "-p", &demo.id().to_string(), dir.to_str().unwrap()])
            .stderr(Stdio::piped())
            .default_signals(),
    )
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let up = loop {
        // Only (listed): root may not look into a user's FUSE mount without allow_root.
        if mounted(&dir) {
            break true;
        }
        if mount.try_wait().unwrap().is_some() {
            break false;
        }
        if Instant::now() > deadline {
            let _ = mount.kill();
            // SAFETY: umount2 on a path string we own; a killed server leaves its mount.
            unsafe { libc::umount2(c(&dir).as_ptr(), libc::MNT_DETACH) };
            let _ = demo.kill();
            let _ = demo.wait();
            panic!("ustrace mount neither mounted nor failed within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !up {
        let _ = demo.kill();
        let _ = demo.wait();
        let out = mount.wait_with_output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        // Not a bare "Permission denied" on the directory: the helper and what it said,
        // and /dev/fuse when that is what refuses.
        assert!(err.contains("fusermount3"), "{err}");
        let device_refuses = std::fs::metadata("/dev/fuse").is_ok_and(|m| {
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o006 != 0o006
        });
        if device_refuses {
            assert!(err.contains("cannot open /dev/fuse"), "{err}");
        }
        eprintln!(
            "skipped: this machine lets no user mount FUSE ({})",
            err.trim()
        );
        return;
    }
    let out = as_unprivileged(Command::new("sh").arg("-c").arg(format!(
        "cat {d}/tracing_on && echo from-a-user > {d}/trace_marker && cat {d}/trace",
        d = dir.display()
    )))
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with("1\n") && text.contains("from-a-user"),
        "{text}"
    );
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(mount.id() as i32, libc::SIGINT) };
    let status = wait_exit(&mut mount, Duration::from_secs(10));
    let _ = demo.kill();
    let _ = demo.wait();
    assert!(status.success());
    assert!(!mounted(&dir), "the user's mount is left behind");
}
