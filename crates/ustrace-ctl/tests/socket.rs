//! The control socket end to end: a real server over a real Unix socket, driven by the real
//! client, including hostile input and a client of another uid.

mod common;

use common::{serve_sample, TempDir};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ustrace_ctl::client::{Client, CtlError};
use ustrace_ctl::memfs::MemFs;
use ustrace_ctl::proto::{self, Reply, Request};
use ustrace_ctl::server::{self, ServerConfig};
use ustrace_ctl::vfs::{Errno, FileKind, OpenFlags};

fn remote_errno<T: std::fmt::Debug>(r: Result<T, CtlError>) -> Errno {
    match r {
        Err(CtlError::Remote { errno, .. }) => errno,
        other => panic!("expected a remote error, got {other:?}"),
    }
}

/// Gives a child the default action for every signal and an empty signal mask, whatever this
/// test process inherited: under `nohup` (SIGHUP ignored) or from a shell that ignores SIGINT,
/// a child would otherwise ignore the very signal a test kills it with, and never die.
fn default_signals(cmd: &mut Command) -> &mut Command {
    // SAFETY: the hook runs in the forked child before exec and makes only async-signal-safe
    // calls (signal, sigemptyset, sigprocmask) on stack data.
    unsafe {
        cmd.pre_exec(|| {
            for sig in 1..32 {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        })
    }
}

/// Waits for `child` at most `within`; past that it is killed and the test fails saying
/// what it was waiting for, instead of hanging the suite.
fn wait_within(child: &mut Child, within: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("pid {} did not exit within {within:?}: {what}", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts the sample server in a process of its own (the crate's `ustrace-ctl-sample-server`
/// binary) in `role` (`serve` or `serve-then-exit`) on `dir`, and waits for its `ready`.
fn spawn_server(role: &str, dir: &Path) -> Child {
    let mut child = default_signals(&mut Command::new(env!(
        "CARGO_BIN_EXE_ustrace-ctl-sample-server"
    )))
    .arg(role)
    .arg(dir)
    .stdout(Stdio::piped())
    .stdin(Stdio::null())
    .spawn()
    .expect("start ustrace-ctl-sample-server");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    match lines.next() {
        Some(Ok(line)) if line == "ready" => {}
        other => panic!("sample server ({role}) exited before it was ready: {other:?}"),
    }
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    child
}

#[test]
fn every_operation_round_trips() {
    let s = serve_sample();
    let mut c = Client::connect_path(s.handle.socket_path()).unwrap();
    let info = c.hello().unwrap();
    assert_eq!(info.pid, std::process::id());
    assert_eq!(info.version, proto::VERSION);

    assert_eq!(c.stat("events").unwrap().kind, FileKind::Dir);
    assert_eq!(c.stat("/trace").unwrap().mode, 0o644);
    assert_eq!(remote_errno(c.stat("nope")), Errno::ENOENT);
    let names: Vec<String> = c.readdir("").unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(
        names,
        ["events", "instances", "trace", "trace_pipe", "tracing_on"]
    );

    assert_eq!(c.read_file("trace").unwrap(), b"# tracer: nop\n");
    c.write_file("trace", b"", false).unwrap();
    assert_eq!(c.read_file("trace").unwrap(), b"");
    c.write_file("trace", b"a\n", true).unwrap();
    c.write_file("trace", b"b\n", true).unwrap();
    assert_eq!(s.fs.content("trace").unwrap(), b"a\nb\n");

    let enable = "events/sched/sched_switch/enable";
    assert_eq!(c.write_file(enable, b"1\n", false).unwrap(), 2);
    assert_eq!(s.fs.content(enable).unwrap(), b"1\n");
    let filter = "events/sched/sched_switch/filter";
    assert_eq!(
        remote_errno(c.write_file(filter, b"x > 1", false)),
        Errno::EINVAL
    );
    c.write_file(filter, b"prev_pid > 1", false).unwrap();

    c.mkdir("instances/foo").unwrap();
    assert_eq!(remote_errno(c.mkdir("instances/foo")), Errno::EEXIST);
    assert_eq!(c.read_file("instances/foo/tracing_on").unwrap(), b"1\n");
    c.rmdir("instances/foo").unwrap();
    assert_eq!(remote_errno(c.rmdir("instances/foo")), Errno::ENOENT);

    // Handles: a write-only open, several writes, close; handles die with their connection.
    let f = c.open("trace", OpenFlags::TRUNCATE).unwrap();
    assert!(!f.stream);
    c.write(f.handle, b"x").unwrap();
    c.write(f.handle, b"y").unwrap();
    c.close(f.handle).unwrap();
    assert_eq!(s.fs.content("trace").unwrap(), b"xy");
    assert_eq!(remote_errno(c.close(f.handle)), Errno::EBADF);
    assert_eq!(remote_errno(c.read(12345, 10, None)), Errno::EBADF);
}

#[test]
fn socket_is_private_and_removed_on_drop() {
    let s = serve_sample();
    let sock = s.handle.socket_path().to_owned();
    assert_eq!(
        sock.file_name().unwrap().to_str().unwrap(),
        format!("{}.sock", std::process::id())
    );
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let dir_mode = std::fs::metadata(sock.parent().unwrap())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dir_mode, 0o700);
    // A second server for the same process in the same directory is refused.
    let again = ServerConfig {
        socket_dir: Some(sock.parent().unwrap().into()),
        ..Default::default()
    };
    let err = server::serve_with(Arc::new(MemFs::sample()), again).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    drop(s.handle);
    assert!(!sock.exists(), "socket left behind after drop");
}

#[test]
fn stale_socket_of_a_dead_server_is_replaced() {
    let dir = TempDir::new("stale");
    let sock_dir = dir.path().join("u");
    std::fs::create_dir(&sock_dir).unwrap();
    let path = sock_dir.join(format!("{}.sock", std::process::id()));
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let config = ServerConfig {
        socket_dir: Some(sock_dir),
        ..Default::default()
    };
    let h = server::serve_with(Arc::new(MemFs::sample()), config).unwrap();
    Client::connect_path(h.socket_path())
        .unwrap()
        .hello()
        .unwrap();
}

#[test]
fn socket_is_removed_at_normal_exit() {
    let dir = TempDir::new("exit");
    let sock_dir = dir.path().join("u");
    let mut child = spawn_server("serve-then-exit", &sock_dir);
    let status = wait_within(
        &mut child,
        Duration::from_secs(30),
        "the sample server should serve once and exit",
    );
    assert!(status.success());
    let left: Vec<_> = std::fs::read_dir(&sock_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "sockets left after exit: {left:?}");
}

#[test]
fn socket_is_removed_when_a_signal_kills_the_process() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let dir = TempDir::new("signal");
        let sock_dir = dir.path().join("u");
        let mut child = spawn_server("serve", &sock_dir);
        let sock = sock_dir.join(format!("{}.sock", child.id()));
        assert!(sock.exists());
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = wait_within(
            &mut child,
            Duration::from_secs(10),
            &format!("the sample server should die of signal {sig}"),
        );
        // It still dies of the signal, as it would have without a server.
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(sig)
        );
        assert!(!sock.exists(), "socket left behind after signal {sig}");
    }
}

/// The suite run under `nohup` or from a shell that ignores SIGINT: the signal test, run
/// as a child that ignores SIGINT and SIGHUP, must still pass, and within a bound.
#[test]
fn signal_test_passes_when_the_suite_ignores_signals() {
    if std::env::var_os("USTRACE_TEST_SIGNALS_IGNORED").is_some() {
        // The inner run of this very test: nothing to do (the filter below selects the
        // signal test only; this guard keeps a broader filter from recursing).
        return;
    }
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "socket_is_removed_when_a_signal_kills_the_process",
        "--nocapture",
    ])
    .env("USTRACE_TEST_SIGNALS_IGNORED", "1")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    // SAFETY: the hook runs in the forked child before exec and only calls signal(2).
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let status = wait_within(
        &mut child,
        Duration::from_secs(60),
        "the signal test hung with SIGINT and SIGHUP ignored (do its children inherit the \
         ignored signals?)",
    );
    let out = child.wait_with_output().unwrap();
    assert!(
        status.success(),
        "the signal test failed with SIGINT and SIGHUP ignored:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn stream_reads_wait_time_out_and_deliver() {
    let s = serve_sample();
    let mut c = Client::connect_path(s.handle.socket_path()).unwrap();
    let pipe = c.open("trace_pipe", OpenFlags::READ).unwrap();
    assert!(pipe.stream);
    let start = Instant::now();
    assert_eq!(
        remote_errno(c.read(pipe.handle, 100, Some(Duration::from_millis(150)))),
        Errno::EAGAIN
    );
    assert!(start.elapsed() >= Duration::from_millis(150));
    assert_eq!(
        remote_errno(c.read(pipe.handle, 100, Some(Duration::ZERO))),
        Errno::EAGAIN
    );
    let fs = s.fs.clone();
    let pusher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(250));
        fs.push("trace_pipe", b"line 1\n").unwrap();
    });
    // Waits across several server-side slices.
    assert_eq!(c.read(pipe.handle, 100, None).unwrap(), b"line 1\n");
    pusher.join().unwrap();
    assert_eq!(remote_errno(c.read_file("trace_pipe")), Errno::EINVAL);
}

#[test]
fn a_vanished_stream_reader_frees_its_thread() {
    let s = serve_sample();
    let mut c = Client::connect_path(s.handle.socket_path()).unwrap();
    let pipe = c.open("trace_pipe", OpenFlags::READ).unwrap();
    let read = Request::Read {
        handle: pipe.handle,
        max: 100,
        wait_ms: proto::WAIT_FOREVER,
    };
    c.send_raw(&read.encode()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(s.handle.active_connections(), 1);
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(2);
    while s.handle.active_connections() != 0 {
        assert!(
            Instant::now() < deadline,
            "server still serving a client that hung up"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn raw_errno(c: &mut Client, frame: &[u8]) -> i32 {
    c.send_raw(frame).unwrap();
    match c.recv_reply().unwrap() {
        Reply::Error { errno, .. } => errno,
        other => panic!("expected an error reply, got {other:?}"),
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

#[test]
fn bad_input_gets_error_replies_and_the_server_keeps_answering() {
    let s = serve_sample();
    let path = s.handle.socket_path().to_owned();
    let mut c = Client::connect_path(&path).unwrap();

    // Unknown verb, wrong version, empty body, truncated fields, trailing bytes: an error
    // reply each, and the same connection goes on working.
    assert_eq!(
        raw_errno(&mut c, &frame(&[proto::VERSION, 0x66])),
        libc::ENOSYS
    );
    assert_eq!(raw_errno(&mut c, &frame(&[9, 0x01])), libc::EPROTONOSUPPORT);
    assert_eq!(raw_errno(&mut c, &frame(&[])), libc::EINVAL);
    assert_eq!(
        raw_errno(&mut c, &frame(&[proto::VERSION, 0x02, 200, 0, b'a'])),
        libc::EINVAL
    );
    assert_eq!(
        raw_errno(&mut c, &frame(&[proto::VERSION, 0x01, 0])),
        libc::EINVAL
    );
    // A Write claiming 4 GiB of data inside a small frame.
    let mut body = vec![proto::VERSION, 0x06];
    body.extend_from_slice(&1u64.to_le_bytes());
    body.extend_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(raw_errno(&mut c, &frame(&body)), libc::E2BIG);
    // Paths that try to leave the tree.
    for p in [
        "..",
        "../etc/passwd",
        "events/../../x",
        "/events/sched/../..",
    ] {
        assert_eq!(remote_errno(c.stat(p)), Errno::EINVAL, "{p}");
        assert_eq!(
            remote_errno(c.write_file(p, b"1", false)),
            Errno::EINVAL,
            "{p}"
        );
        assert_eq!(remote_errno(c.mkdir(p)), Errno::EINVAL, "{p}");
    }
    assert_eq!(c.hello().unwrap().pid, std::process::id());

    // A huge length: an error reply, then the connection is closed (nothing after it can be
    // trusted) — but the server answers the next client.
    let mut c = Client::connect_path(&path).unwrap();
    assert_eq!(raw_errno(&mut c, &u32::MAX.to_le_bytes()), libc::E2BIG);
    assert!(
        c.hello().is_err(),
        "connection survived an untrusted frame length"
    );

    // A truncated frame followed by a hang-up, at every possible cut of a real request.
    let real = Request::WriteFile {
        path: "trace".into(),
        data: b"zz".to_vec(),
        append: true,
    }
    .encode();
    for cut in 1..real.len() {
        let mut c = Client::connect_path(&path).unwrap();
        c.send_raw(&real[..cut]).unwrap();
    }
    // A client that sends half a frame and then goes silent does not block others.
    let mut stuck = Client::connect_path(&path).unwrap();
    stuck.send_raw(&real[..5]).unwrap();

    // Random garbage frames.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut c = Client::connect_path(&path).unwrap();
    for _ in 0..2000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = (seed % 40) as usize;
        let body: Vec<u8> = (0..len)
            .map(|i| (seed >> (i % 8 * 8)) as u8 ^ i as u8)
            .collect();
        let mut body = body;
        if body.len() >= 2 && !seed.is_multiple_of(3) {
            body[0] = proto::VERSION;
        }
        c.send_raw(&frame(&body)).unwrap();
        c.recv_reply().unwrap();
    }

    let mut fresh = Client::connect_path(&path).unwrap();
    assert_eq!(fresh.read_file("tracing_on").unwrap(), b"1\n");
    assert!(
        !s.fs.content("trace").unwrap().ends_with(b"zz"),
        "a truncated frame was executed"
    );
    drop(stuck);
}

#[test]
fn connection_limit_is_enforced() {
    let dir = TempDir::new("limit");
    let config = ServerConfig {
        socket_dir: Some(dir.path().join("u")),
        max_connections: 2,
        log: Arc::new(|_: &str| {}),
        ..ServerConfig::default()
    };
    let h = server::serve_with(Arc::new(MemFs::sample()), config).unwrap();
    let mut a = Client::connect_path(h.socket_path()).unwrap();
    let mut b = Client::connect_path(h.socket_path()).unwrap();
    a.hello().unwrap();
    b.hello().unwrap();
    let mut c = Client::connect_path(h.socket_path()).unwrap();
    assert_eq!(remote_errno(c.hello()), Errno(libc::EMFILE));
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut d = Client::connect_path(h.socket_path()).unwrap();
        if d.hello().is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slot not freed after a client left"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Connects as uid 65534 in a forked child using only raw syscalls (the test process has
/// other threads, so the child must not allocate). Exit status: 0 = got an EACCES error reply,
/// 1 = connect(2) refused with EACCES, 2 = anything else.
fn connect_as_nobody(path: &std::path::Path) -> i32 {
    let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut addr: libc::sockaddr_un = unsafe {
        // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
        std::mem::zeroed()
    };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(cpath.as_bytes_with_nul()) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: fork in a test; the child only makes async-signal-safe syscalls on stack data
    // and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: (child) raw syscalls on stack buffers, then _exit; no allocation, no locks.
        unsafe {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                libc::_exit(2);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let rc = libc::connect(
                fd,
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            if rc != 0 {
                let e = *libc::__errno_location();
                libc::_exit(if e == libc::EACCES { 1 } else { 2 });
            }
            let mut buf = [0u8; 512];
            let mut got = 0usize;
            loop {
                let n = libc::read(fd, buf.as_mut_ptr().add(got).cast(), buf.len() - got);
                if n <= 0 {
                    break;
                }
                got += n as usize;
            }
            // len(4) version(1) code(1) errno(4)
            let ok = got >= 10
                && buf[5] == 0xff
                && i32::from_le_bytes([buf[6], buf[7], buf[8], buf[9]]) == libc::EACCES;
            libc::_exit(if ok { 0 } else { 2 });
        }
    }
    let mut status = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: polls for the child we just forked.
    while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == 0 {
        if Instant::now() > deadline {
            // SAFETY: kill and reap the child we forked, which has not been reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the uid 65534 client did not finish within 10 s (no reply from the server?)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(libc::WIFEXITED(status), "child died: {status:#x}");
    libc::WEXITSTATUS(status)
}

#[test]
fn a_client_of_another_uid_is_refused_and_logged() {
    if !common::is_root() {
        eprintln!("skipped: needs root to run a client as uid 65534");
        return;
    }
    let s = serve_sample();
    let sock = s.handle.socket_path().to_owned();
    // First line of defence: the 0700 directory and 0600 socket.
    assert_eq!(connect_as_nobody(&sock), 1);
    // Second: with the file modes opened up, SO_PEERCRED still refuses, and says so.
    std::fs::set_permissions(
        sock.parent().unwrap(),
        std::fs::Permissions::from_mode(0o711),
    )
    .unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    // The test's own temp dir must be traversable too.
    std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    assert_eq!(connect_as_nobody(&sock), 0);
    let log = s.log.lock().unwrap().clone();
    assert!(
        log.iter()
            .any(|l| l.contains("refused control connection") && l.contains("uid 65534")),
        "refusal not logged: {log:?}"
    );
    // Root itself is still served.
    Client::connect_path(&sock).unwrap().hello().unwrap();
}

#[test]
fn discovery_lists_live_servers_and_removes_stale_sockets() {
    let s = serve_sample();
    let dir = s.handle.socket_path().parent().unwrap().to_owned();
    // pid_max is at most 2^22, so no process can have this pid.
    let dead = dir.join("4194304.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    let found = ustrace_ctl::client::list_in(std::slice::from_ref(&dir));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].pid, std::process::id());
    assert!(!found[0].comm.is_empty());
    assert!(!dead.exists(), "stale socket of a dead pid not removed");
}

#[test]
fn many_clients_at_once() {
    let s = serve_sample();
    let path = s.handle.socket_path().to_owned();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect_path(&path).unwrap();
                let dir = format!("instances/t{i}");
                c.mkdir(&dir).unwrap();
                let file = format!("{dir}/tracing_on");
                for j in 0..200 {
                    let text = format!("{}", (i + j) % 2);
                    c.write_file(&file, text.as_bytes(), false).unwrap();
                    assert_eq!(c.read_file(&file).unwrap(), text.as_bytes());
                    // Everyone hammers the shared root listing at the same time.
                    assert!(!c.readdir("instances").unwrap().is_empty());
                }
                c.rmdir(&dir).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn serve_connection_serves_a_socket_pair() {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let fs = Arc::new(MemFs::sample());
    let server = {
        let fs = fs.clone();
        std::thread::spawn(move || server::serve_connection(fs, theirs))
    };
    let mut c = Client::from_stream(ours);
    c.write_file("tracing_on", b"0", false).unwrap();
    assert_eq!(fs.content("tracing_on").unwrap(), b"0");
    drop(c);
    server.join().unwrap();
}

/// The child processes are a binary of their own: no `#[test]` here is a role that returns at
/// once when run by the harness, which would count as a pass that checked nothing.
#[test]
fn every_listed_test_is_a_test() {
    common::assert_only_tests_listed("socket_is_removed_at_normal_exit");
}
