//! The control socket under pressure and among other users: a server out of file
//! descriptors still answers, socket directories it did not make keep their modes and unsafe
//! ones are refused, another user cannot stop a server by taking its default directory, and
//! a client that sends half a frame cannot hold its connection forever.

mod common;

use common::{serve_sample, TempDir};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ustrace_ctl::client::{self, Client, CtlError};
use ustrace_ctl::discover;
use ustrace_ctl::memfs::MemFs;
use ustrace_ctl::proto::Reply;
use ustrace_ctl::server::{self, ServerConfig};
use ustrace_ctl::vfs::Errno;

/// The process these tests start when a server must live in a process of its own.
const SAMPLE_SERVER: &str = env!("CARGO_BIN_EXE_ustrace-ctl-sample-server");

struct Kid {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Kid {
    /// Starts the sample server binary with `args` (one of its roles that print
    /// `ready SOCKET`); returns it and the socket.
    fn spawn(args: &[&OsStr], setup: impl FnOnce(&mut Command)) -> (Kid, String) {
        let mut cmd = Command::new(SAMPLE_SERVER);
        cmd.args(args).stdout(Stdio::piped()).stdin(Stdio::piped());
        setup(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut kid = Kid {
            child,
            stdin,
            lines,
        };
        let ready = kid.wait_for("ready ");
        (kid, ready)
    }

    /// The rest of the first output line that contains `word`.
    fn wait_for(&mut self, word: &str) -> String {
        for line in self.lines.by_ref() {
            let line = line.unwrap();
            if let Some(i) = line.find(word) {
                return line[i + word.len()..].trim().to_owned();
            }
        }
        panic!("child exited before printing {word:?}");
    }

    fn tell(&mut self) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_server_out_of_file_descriptors_answers_with_an_error() {
    let dir = TempDir::new("emfile");
    let sock_dir = dir.path().join("u");
    let (mut kid, socket) = Kid::spawn(&["emfile".as_ref(), sock_dir.as_os_str()], |_| {});
    let socket = PathBuf::from(socket);
    for attempt in 0..2 {
        let mut c = Client::connect_path(&socket).unwrap();
        c.set_timeout(Some(Duration::from_secs(5)));
        let started = Instant::now();
        match c.hello() {
            Err(CtlError::Remote { errno, message }) => {
                assert_eq!(errno, Errno(libc::EMFILE), "attempt {attempt}: {message}");
                assert!(
                    message.contains("used all the file descriptors its RLIMIT_NOFILE"),
                    "attempt {attempt}: {message}"
                );
                let shown = CtlError::Remote { errno, message }.to_string();
                assert!(shown.starts_with("Too many open files ("), "{shown}");
            }
            other => panic!(
                "attempt {attempt}: expected an EMFILE error reply, got {other:?} after {:?}",
                started.elapsed()
            ),
        }
    }
    // Once files are closed again, the same server serves.
    kid.tell();
    kid.wait_for("released");
    let mut c = Client::connect_path(&socket).unwrap();
    c.set_timeout(Some(Duration::from_secs(5)));
    assert_eq!(c.read_file("tracing_on").unwrap(), b"1\n");
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn serve_in(dir: &Path) -> std::io::Result<server::ServerHandle> {
    let config = ServerConfig {
        socket_dir: Some(dir.to_owned()),
        log: Arc::new(|_: &str| {}),
        ..ServerConfig::default()
    };
    server::serve_with(Arc::new(MemFs::sample()), config)
}

#[test]
fn an_existing_socket_directory_keeps_its_mode() {
    let tmp = TempDir::new("dirmode");
    // A shared, sticky directory such as /tmp: safe to serve in, and left exactly as it was.
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let h = serve_in(&shared).unwrap();
    assert_eq!(
        mode(&shared),
        0o1777,
        "the shared directory's mode was changed"
    );
    assert_eq!(mode(h.socket_path()), 0o600);
    Client::connect_path(h.socket_path())
        .unwrap()
        .hello()
        .unwrap();
    drop(h);
    assert_eq!(mode(&shared), 0o1777);

    // Our own directory that others may read: used, not tightened behind our back.
    let readable = tmp.path().join("readable");
    std::fs::create_dir(&readable).unwrap();
    std::fs::set_permissions(&readable, std::fs::Permissions::from_mode(0o755)).unwrap();
    let h = serve_in(&readable).unwrap();
    assert_eq!(mode(&readable), 0o755);
    drop(h);

    // A directory we make is private.
    let fresh = tmp.path().join("fresh");
    let h = serve_in(&fresh).unwrap();
    assert_eq!(mode(&fresh), 0o700);
    drop(h);
}

#[test]
fn an_unsafe_socket_directory_is_refused_and_left_alone() {
    let tmp = TempDir::new("unsafe");
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = serve_in(&open).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
    let msg = err.to_string();
    assert!(
        msg.contains("writable by other users (mode 0777) and not sticky"),
        "{msg}"
    );
    assert!(msg.contains(discover::SOCKET_DIR_ENV), "{msg}");
    assert_eq!(mode(&open), 0o777, "a refused directory was changed");
    assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0, "left a file");

    let group = tmp.path().join("group");
    std::fs::create_dir(&group).unwrap();
    std::fs::set_permissions(&group, std::fs::Permissions::from_mode(0o770)).unwrap();
    let msg = serve_in(&group).unwrap_err().to_string();
    assert!(msg.contains("mode 0770"), "{msg}");
    assert_eq!(mode(&group), 0o770);

    let link = tmp.path().join("link");
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let msg = serve_in(&link).unwrap_err().to_string();
    assert!(msg.contains("is a symbolic link"), "{msg}");

    if common::is_root() {
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let msg = serve_in(&theirs).unwrap_err().to_string();
        assert!(msg.contains("belongs to uid 65534"), "{msg}");
        assert_eq!(mode(&theirs), 0o755 & !umask());
    } else {
        eprintln!("skipped (part): a directory of another user needs root to make");
    }
}

fn umask() -> u32 {
    // SAFETY: umask has no preconditions; it is set back at once.
    unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old
    }
}

#[test]
fn a_half_sent_frame_times_out_but_an_idle_client_stays() {
    let dir = TempDir::new("slow");
    let log = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = log.clone();
    let config = ServerConfig {
        socket_dir: Some(dir.path().join("u")),
        log: Arc::new(move |m: &str| sink.lock().unwrap().push(m.to_owned())),
        frame_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let h = server::serve_with(Arc::new(MemFs::sample()), config).unwrap();

    let mut idle = Client::connect_path(h.socket_path()).unwrap();
    idle.hello().unwrap();

    // Two bytes of a length, then a trickle: the frame as a whole is late.
    let mut slow = std::os::unix::net::UnixStream::connect(h.socket_path()).unwrap();
    slow.write_all(&[10, 0]).unwrap();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(150));
        let _ = slow.write_all(&[0]);
    }
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reply = Vec::new();
    slow.read_to_end(&mut reply)
        .expect("the server did not close the slow connection");
    let frame = ustrace_ctl::proto::read_frame(&mut reply.as_slice()).unwrap();
    match Reply::decode(&frame).unwrap() {
        Reply::Error { errno, message } => {
            assert_eq!(errno, libc::ETIMEDOUT, "{message}");
            assert!(message.contains("not completed"), "{message}");
        }
        other => panic!("unexpected reply {other:?}"),
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while h.active_connections() != 1 {
        assert!(Instant::now() < deadline, "the slow client's slot was kept");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        log.lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("not completed")),
        "the timeout was not logged"
    );

    // Idle for longer than the frame timeout between requests: still served.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(idle.read_file("tracing_on").unwrap(), b"1\n");
}

/// Makes `cmd` run as uid 65534 with no socket directory in its environment; only root can.
fn as_nobody(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.uid(65534)
        .gid(65534)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove(discover::SOCKET_DIR_ENV)
        .current_dir("/");
}

#[test]
fn another_user_cannot_stop_a_server_by_taking_its_directory() {
    if !common::is_root() {
        eprintln!("skipped: needs root to run a server as uid 65534");
        return;
    }
    let taken = PathBuf::from("/tmp/ustrace-65534");
    if taken.exists() {
        eprintln!(
            "skipped: {} already exists; not touching it",
            taken.display()
        );
        return;
    }
    // Another user (uid 1) makes the directory first, as an attacker would.
    std::fs::create_dir(&taken).unwrap();
    std::fs::set_permissions(&taken, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&taken, Some(1), Some(1)).unwrap();
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _taken = Remove(taken.clone());
    // A socket planted there must not be taken for the server's.
    let exe = Path::new(SAMPLE_SERVER);
    let exe_ok = exe
        .ancestors()
        .all(|p| std::fs::metadata(p).is_ok_and(|m| m.mode() & 0o001 != 0));
    if !exe_ok {
        eprintln!("skipped: uid 65534 cannot reach {}", exe.display());
        return;
    }
    let (kid, socket) = Kid::spawn(&["default".as_ref()], as_nobody);
    let socket = PathBuf::from(socket);
    let dir = socket.parent().unwrap().to_owned();
    let _fallback = Remove(dir.clone());
    assert!(
        discover::is_fallback_dir(&dir, 65534),
        "served from {} instead of a private fallback",
        dir.display()
    );
    let meta = std::fs::symlink_metadata(&dir).unwrap();
    assert_eq!(meta.uid(), 65534);
    assert_eq!(meta.mode() & 0o7777, 0o700);
    let pid = kid.child.id();
    // The attacker plants a decoy socket for the server's pid: discovery must skip it.
    let decoy = discover::socket_name(&taken, pid);
    let _decoy_listener = std::os::unix::net::UnixListener::bind(&decoy).unwrap();
    assert_eq!(discover::find_socket(pid).unwrap(), socket);
    let mut c = Client::connect(pid).unwrap();
    assert_eq!(c.hello().unwrap().pid, pid);
    assert!(
        client::list()
            .iter()
            .any(|s| s.pid == pid && s.socket == socket),
        "ustrace ps does not list the server in its fallback directory"
    );
    drop(c);
    drop(kid);
    // The server removes its private directory when it leaves.
    let deadline = Instant::now() + Duration::from_secs(5);
    while dir.exists() {
        assert!(Instant::now() < deadline, "{} left behind", dir.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn discovery_ignores_sockets_in_directories_others_control() {
    let s = serve_sample();
    let dir = s.handle.socket_path().parent().unwrap().to_owned();
    let me = std::process::id();
    assert_eq!(
        client::list_in(std::slice::from_ref(&dir))
            .iter()
            .filter(|x| x.pid == me)
            .count(),
        1
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(
        client::list_in(std::slice::from_ref(&dir)).is_empty(),
        "listed a socket from a directory anyone can write"
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
}

#[test]
fn a_server_that_never_answers_is_reported_as_such() {
    let dir = TempDir::new("mute");
    let path = dir.path().join("mute.sock");
    // Never accepted: the backlog holds the connection, as for a stopped process.
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let mut c = Client::connect_path(&path).unwrap();
    c.set_timeout(Some(Duration::from_millis(200)));
    let err = c.hello().unwrap_err();
    assert_eq!(err.errno(), Errno(libc::ETIMEDOUT), "{err}");
    assert!(
        err.to_string()
            .contains("no reply from the traced process within"),
        "{err}"
    );
}

/// The harness lists only tests: the processes these tests need run the sample server
/// binary, not this one in a hidden role that would count as a test that checks nothing.
#[test]
fn every_listed_test_is_a_test() {
    common::assert_only_tests_listed("a_server_out_of_file_descriptors_answers_with_an_error");
}
