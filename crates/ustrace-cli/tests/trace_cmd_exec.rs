//! The real trace-cmd, run unchanged through `ustrace exec` against a process that links
//! ustrace (the ftrace fixture, which fires `sched` events from a thread of its own).
//!
//! Every child runs under a deadline: a hang (as `trace-cmd extract` once hung on a
//! blocking read that should have said EAGAIN) kills its process group and fails the test
//! instead of stalling CI. Needs root, /dev/fuse and trace-cmd; without them each test
//! prints `skipped: <why>` and passes.

mod common;

use common::DefaultSignals;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ustrace");
const FIXTURE: &str = env!("CARGO_BIN_EXE_ustrace-ftrace-fixture");

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (ustrace exec as a user needs a /dev/fuse it may open)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    let found = Command::new("trace-cmd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if found.is_err() {
        return Some("trace-cmd is not installed (Debian package trace-cmd)".into());
    }
    None
}

macro_rules! skip_unless_ready {
    () => {
        if let Some(why) = skip_reason() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// The fixture, killed when dropped.
struct Fixture {
    child: Child,
    dir: PathBuf,
    /// The other user's socket directory (`/tmp/ustrace-UID`) when this fixture made it:
    /// removed at the end, so later tests find the machine as it was.
    socket_dir: Option<PathBuf>,
}

impl Fixture {
    fn start(name: &str) -> Fixture {
        Fixture::start_as(name, None)
    }

    /// The fixture, run as `uid` (and gid the same) when given.
    fn start_as(name: &str, uid: Option<u32>) -> Fixture {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!(
            "ustrace-trace-cmd-exec-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut cmd = Command::new(FIXTURE);
        let mut socket_dir = None;
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
            let d = std::env::temp_dir().join(format!("ustrace-{uid}"));
            if !d.exists() {
                socket_dir = Some(d);
            }
        }
        let child = cmd
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .default_signals()
            .spawn()
            .expect("start the fixture");
        let f = Fixture {
            child,
            dir,
            socket_dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while f.ctl(&["cat", "tracing_on"]).is_err() {
            assert!(Instant::now() < deadline, "the fixture never served");
            std::thread::sleep(Duration::from_millis(50));
        }
        f
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// `ustrace VERB -p PID ARGS...` over the control socket.
    fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(BIN);
        cmd.arg(args[0]).args(["-p", &self.pid()]).args(&args[1..]);
        let out = run(&mut cmd, Duration::from_secs(20));
        if out.ok {
            Ok(out.stdout)
        } else {
            Err(out.stderr)
        }
    }

    /// `ustrace exec -P PID -- ARGS...`, under a deadline.
    fn exec(&self, args: &[&str], limit: Duration) -> Output {
        let mut cmd = Command::new(BIN);
        cmd.args(["exec", "-P", &self.pid(), "--"]).args(args);
        cmd.current_dir(&self.dir);
        let out = run(&mut cmd, limit);
        assert!(
            !out.timed_out,
            "{args:?} through ustrace exec hung past {limit:?}\nstdout:\n{}\nstderr:\n{}",
            out.stdout, out.stderr
        );
        out
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(d) = &self.socket_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

struct Output {
    ok: bool,
    code: Option<i32>,
    timed_out: bool,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` in a process group of its own; past `limit` the whole group is killed.
fn run(cmd: &mut Command, limit: Duration) -> Output {
    let out_path = std::env::temp_dir().join(format!(
        "ustrace-trace-cmd-exec-out-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let err_path = out_path.with_extension("err");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .process_group(0)
        .default_signals()
        .spawn();
    let mut child = child.expect("spawn");
    let deadline = Instant::now() + limit;
    let (status, timed_out) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (Some(status), false);
        }
        if Instant::now() >= deadline {
            // SAFETY: kill has no memory-safety preconditions; the group is the child's own.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into();
    let out = Output {
        ok: status.is_some_and(|s| s.success()),
        code: status.and_then(|s| s.code()),
        timed_out,
        stdout: read(&out_path),
        stderr: read(&err_path),
    };
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    out
}

fn trace_cmd_report(file: &str) -> String {
    let out = run(
        Command::new("trace-cmd").args(["report", file]),
        Duration::from_secs(60),
    );
    assert!(out.ok && !out.timed_out, "trace-cmd report: {}", out.stderr);
    out.stdout
}

fn assert_ok(what: &str, out: &Output) {
    assert!(
        out.ok,
        "{what} failed\nstdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
}

#[test]
fn the_process_tracefs_is_the_one_tools_find() {
    skip_unless_ready!();
    let f = Fixture::start("found");
    f.ctl(&["write", "events/sched/sched_switch/enable", "1"])
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let out = f.exec(
        &[
            "sh",
            "-c",
            "grep ' tracefs ' /proc/mounts | head -1; grep -c . /sys/kernel/tracing/available_tracers; \
             test -e /proc/sys/kernel/ftrace_enabled && echo switch-visible; \
             test -r /sys/kernel/tracing/printk_formats || echo no-printk-formats; \
             head -c 100000 /sys/kernel/tracing/trace",
        ],
        Duration::from_secs(30),
    );
    assert_ok("sh", &out);
    let mut lines = out.stdout.lines();
    let first = lines.next().unwrap_or("");
    assert!(
        first.split(' ').nth(1) == Some("/sys/kernel/tracing"),
        "the first tracefs line of /proc/mounts: {first:?}"
    );
    // The kernel lists `function` too; the process has only `nop`.
    assert_eq!(lines.next(), Some("1"), "{}", out.stdout);
    assert!(
        !out.stdout.contains("switch-visible"),
        "the kernel's ftrace_enabled is shown"
    );
    // trace-cmd record saves it; the kernel always has it.
    assert!(!out.stdout.contains("no-printk-formats"), "{}", out.stdout);
    assert!(
        out.stdout.contains("fixture-work") && out.stdout.contains("sched_switch"),
        "trace is not the process's:\n{}",
        out.stdout
    );
    // The command's status is ustrace exec's, as a shell gives it.
    let out = f.exec(&["sh", "-c", "exit 7"], Duration::from_secs(30));
    assert_eq!(out.code, Some(7));
    let out = f.exec(&["/no/such/command"], Duration::from_secs(30));
    assert_eq!(out.code, Some(127), "{}", out.stderr);
    // Nothing is left mounted outside.
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains("ustrace-exec-"),
        "a staging mount leaked:\n{mounts}"
    );
}

#[test]
fn trace_cmd_record_and_extract_give_files_trace_cmd_reports() {
    skip_unless_ready!();
    let f = Fixture::start("record");
    let dat = f.file("record.dat");
    let out = f.exec(
        &[
            "trace-cmd",
            "record",
            "-e",
            "sched:sched_switch",
            "-o",
            &dat,
            "sleep",
            "1",
        ],
        Duration::from_secs(60),
    );
    assert_ok("trace-cmd record", &out);
    assert!(
        !format!("{}{}", out.stdout, out.stderr).contains("events lost"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    let report = trace_cmd_report(&dat);
    let switches = report
        .lines()
        .filter(|l| l.contains("sched_switch:"))
        .count();
    assert!(
        switches > 10 && report.contains("fixture-work"),
        "trace-cmd report of the recording:\n{}",
        &report[..report.len().min(4000)]
    );
    assert!(
        !report.contains("sched_waking:"),
        "an event not asked for was recorded"
    );

    // The recorder splices from trace_pipe_raw while the command runs: with 256 KiB a CPU
    // and the fixture's ~0.5 MB/s of sched events a CPU, two seconds overflow the buffers
    // unless pages leave them during the run (through FUSE a splice used to move nothing,
    // and everything came at the final flush, the rest lost).
    let busy = f.file("busy.dat");
    let out = f.exec(
        &[
            "trace-cmd",
            "record",
            "-b",
            "256",
            "-e",
            "sched",
            "-o",
            &busy,
            "sleep",
            "2",
        ],
        Duration::from_secs(60),
    );
    assert_ok("trace-cmd record -b 256", &out);
    let said = format!("{}{}", out.stdout, out.stderr);
    assert!(!said.contains("events lost"), "{said}");
    let report = trace_cmd_report(&busy);
    assert!(
        report
            .lines()
            .filter(|l| l.contains("sched_waking:"))
            .count()
            > 1000,
        "{}",
        &report[..report.len().min(4000)]
    );

    // With the buffer empty, extract's final non-blocking reads must see EAGAIN and end
    // (this is what hung: the mount blocked on them).
    f.ctl(&["write", "events/enable", "0"]).unwrap();
    f.ctl(&["write", "trace", ""]).unwrap();
    let empty = f.file("empty.dat");
    let started = Instant::now();
    let out = f.exec(
        &["trace-cmd", "extract", "-o", &empty],
        Duration::from_secs(30),
    );
    assert_ok("trace-cmd extract (empty buffer)", &out);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "extract took {:?}",
        started.elapsed()
    );

    // And with events written all the while, extract still ends and has them.
    f.ctl(&["write", "events/sched/enable", "1"]).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let live = f.file("extract.dat");
    let out = f.exec(
        &["trace-cmd", "extract", "-o", &live],
        Duration::from_secs(60),
    );
    assert_ok("trace-cmd extract", &out);
    let report = trace_cmd_report(&live);
    for event in ["sched_switch:", "sched_waking:", "sched_wakeup:"] {
        assert!(
            report.contains(event),
            "{event} missing from the extracted file:\n{}",
            &report[..report.len().min(4000)]
        );
    }
}

#[test]
fn trace_cmd_show_stat_list_and_reset() {
    skip_unless_ready!();
    let f = Fixture::start("verbs");
    f.ctl(&["write", "events/sched/sched_switch/filter", "prev_pid > 0"])
        .unwrap();
    f.ctl(&["write", "events/sched/sched_switch/enable", "1"])
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let limit = Duration::from_secs(30);

    let out = f.exec(&["trace-cmd", "show"], limit);
    assert_ok("trace-cmd show", &out);
    assert!(
        out.stdout.starts_with("# tracer: nop") && out.stdout.contains("fixture-work"),
        "trace-cmd show:\n{}",
        &out.stdout[..out.stdout.len().min(3000)]
    );

    let out = f.exec(&["trace-cmd", "stat"], limit);
    assert_ok("trace-cmd stat", &out);
    for want in [
        "Individual events:",
        "sched_switch",
        "sched:sched_switch \"prev_pid > 0\"",
        "Buffer size in kilobytes",
        "Tracing is enabled",
    ] {
        assert!(
            out.stdout.contains(want),
            "trace-cmd stat lacks {want:?}:\n{}",
            out.stdout
        );
    }

    let out = f.exec(&["trace-cmd", "list", "-e"], limit);
    assert_ok("trace-cmd list -e", &out);
    let events: Vec<&str> = out.stdout.lines().collect();
    for want in [
        "sched:sched_switch",
        "kmem:kfree",
        "syscalls:sys_enter_openat",
    ] {
        assert!(
            events.contains(&want),
            "list -e lacks {want}:\n{}",
            out.stdout
        );
    }
    let out = f.exec(&["trace-cmd", "list", "-t"], limit);
    assert_ok("trace-cmd list -t", &out);
    assert_eq!(out.stdout.trim(), "function_graph function nop");
    let out = f.exec(&["trace-cmd", "list", "-o"], limit);
    assert_ok("trace-cmd list -o", &out);
    assert!(
        out.stdout.lines().any(|l| l == "record-cmd"),
        "{}",
        out.stdout
    );

    let out = f.exec(&["trace-cmd", "reset"], limit);
    assert_ok("trace-cmd reset", &out);
    assert_eq!(
        f.ctl(&["cat", "events/sched/sched_switch/enable"]).unwrap(),
        "0\n"
    );
    assert_eq!(
        f.ctl(&["cat", "events/sched/sched_switch/filter"]).unwrap(),
        "none\n"
    );
    let out = f.exec(&["trace-cmd", "stat"], limit);
    assert!(out.stdout.contains("All disabled"), "{}", out.stdout);
}

/// The user's way in: `ustrace exec` run as `nobody` makes a user namespace and mounts FUSE
/// there itself. Most systems let users open /dev/fuse (0666); where it is root's only, as in
/// many containers, the test gives the user a 0666 node of the same device on /dev/fuse in a
/// mount namespace of its own (as root, before dropping to `nobody`).
#[test]
fn a_user_runs_trace_cmd_through_a_user_namespace() {
    skip_unless_ready!();
    const NOBODY: u32 = 65534;
    let f = Fixture::start_as("user", Some(NOBODY));
    let node = std::ffi::CString::new(f.file("fuse")).unwrap();
    let dat = f.file("user.dat");
    let mut cmd = Command::new(BIN);
    cmd.args(["exec", "-P", &f.pid(), "--"])
        .args([
            "trace-cmd",
            "record",
            "-e",
            "sched:sched_switch",
            "-o",
            &dat,
        ])
        .args(["sleep", "1"])
        .current_dir(&f.dir);
    // SAFETY: runs in the forked child before exec and makes only async-signal-safe system
    // calls on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let check = |rc: libc::c_int| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mknod(
                node.as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(10, 229),
            ))?;
            check(libc::chmod(node.as_ptr(), 0o666))?;
            check(libc::mount(
                node.as_ptr(),
                c"/dev/fuse".as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ))?;
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setgid(NOBODY))?;
            check(libc::setuid(NOBODY))?;
            Ok(())
        });
    }
    let out = run(&mut cmd, Duration::from_secs(60));
    assert!(!out.timed_out, "hung:\n{}{}", out.stdout, out.stderr);
    if !out.ok && out.stderr.contains("user namespace") {
        eprintln!(
            "skipped: no unprivileged user namespaces here: {}",
            out.stderr
        );
        return;
    }
    if !out.ok && out.stderr.contains("/dev/fuse") {
        eprintln!(
            "skipped: no /dev/fuse the user may open here: {}",
            out.stderr
        );
        return;
    }
    assert_ok("trace-cmd record as nobody", &out);
    let report = trace_cmd_report(&dat);
    assert!(
        report
            .lines()
            .filter(|l| l.contains("sched_switch:"))
            .count()
            > 10,
        "{}",
        &report[..report.len().min(4000)]
    );
}

/// What libtracefs does with `trace_pipe_raw`, on a plain `ustrace mount`, syscall by
/// syscall: splice pages out while events are written, `ioctl(fd, 0)` (wake the readers),
/// then `O_NONBLOCK` by `fcntl` and read to `EAGAIN`.
#[test]
fn trace_pipe_raw_splices_wakes_and_turns_non_blocking() {
    use std::os::fd::AsRawFd;
    skip_unless_ready!();
    let f = Fixture::start("raw");
    // The syscalls below run in this process: a read that blocks where it should say
    // EAGAIN (the bug this guards) would hang the test, so a watchdog ends it instead.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watched = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(90));
        if !watched.load(std::sync::atomic::Ordering::SeqCst) {
            eprintln!("trace_pipe_raw_splices_wakes_and_turns_non_blocking hung for 90 s");
            std::process::abort();
        }
    });
    let dir = f.dir.join("mnt");
    let mut mount = Command::new(BIN)
        .args(["mount", "-p", &f.pid()])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .default_signals()
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dir.join("per_cpu").exists() {
        assert!(Instant::now() < deadline, "the mount never came");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(dir.join("events/sched/enable"), "1").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // A CPU the fixture's thread ran on.
    let cpu = (0..num_cpus_online())
        .find(|cpu| {
            let stats = std::fs::read_to_string(dir.join(format!("per_cpu/cpu{cpu}/stats")));
            !stats.unwrap_or_default().contains("entries: 0\n")
        })
        .expect("no CPU has events");
    let path = dir.join(format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
    // Blocking, as libtracefs opens it: the CPU has events nobody else consumes, so the
    // splice has a page to move at once.
    let raw = std::fs::File::open(&path).unwrap();
    let fd = raw.as_raw_fd();
    let mut pipe = [0i32; 2];
    // SAFETY: pipe points at two writable ints.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    let mut spliced = 0isize;
    let until = Instant::now() + Duration::from_secs(20);
    while spliced == 0 && Instant::now() < until {
        // SAFETY: both fds are open; null offsets use the files' positions.
        let n = unsafe {
            libc::splice(
                fd,
                std::ptr::null_mut(),
                pipe[1],
                std::ptr::null_mut(),
                4096,
                libc::SPLICE_F_NONBLOCK,
            )
        };
        let e = std::io::Error::last_os_error();
        assert!(
            n >= 0 || e.raw_os_error() == Some(libc::EAGAIN),
            "splice: {e}"
        );
        spliced = n.max(0);
        if n <= 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert_eq!(spliced, 4096, "a splice moves a whole ring-buffer page");
    // SAFETY: fd is open; request 0 takes no argument.
    let woke = unsafe { libc::ioctl(fd, 0) };
    assert_eq!(woke, 0, "ioctl(fd, 0) wakes, as the kernel's");
    // SAFETY: as above (TCGETS, refused as by tracefs, before it would write anything).
    let other = unsafe { libc::ioctl(fd, 0x5401) };
    assert_eq!(other, -1);
    std::fs::write(dir.join("events/sched/enable"), "0").unwrap();
    // SAFETY: fd is open; F_GETFL/F_SETFL take and give flag words.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK), 0);
    }
    let mut page = vec![0u8; 4096];
    let started = Instant::now();
    let last = loop {
        // SAFETY: page is writable for its length.
        let n = unsafe { libc::read(fd, page.as_mut_ptr().cast(), page.len()) };
        if n <= 0 || started.elapsed() > Duration::from_secs(20) {
            break (n, std::io::Error::last_os_error().raw_os_error());
        }
    };
    assert_eq!(
        last,
        (-1, Some(libc::EAGAIN)),
        "read after O_NONBLOCK by fcntl"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: the pipe's fds are ours.
    unsafe {
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
    drop(raw);
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(mount.id() as i32, libc::SIGINT) };
    let _ = mount.wait();
}

fn num_cpus_online() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize
}
