//! Helpers shared by the control-socket and FUSE tests: private socket directories, an
//! in-memory tracefs served with a captured log, and the sample server binary run as a
//! child process for the cases that need a process to die.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use ustrace_ctl::memfs::MemFs;
use ustrace_ctl::server::{self, ServerConfig, ServerHandle};

/// A fresh private directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "ustrace-ctl-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Served {
    pub fs: Arc<MemFs>,
    pub handle: ServerHandle,
    pub log: Arc<Mutex<Vec<String>>>,
    pub dir: TempDir,
}

/// Serves `MemFs::sample()` from a private socket directory, capturing the server's log.
pub fn serve_sample() -> Served {
    let dir = TempDir::new("sock");
    let fs = Arc::new(MemFs::sample());
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    let config = ServerConfig {
        socket_dir: Some(dir.path().join("ustrace")),
        log: Arc::new(move |m: &str| sink.lock().unwrap().push(m.to_owned())),
        ..ServerConfig::default()
    };
    let handle = server::serve_with(fs.clone(), config).unwrap();
    Served {
        fs,
        handle,
        log,
        dir,
    }
}

/// Starts the sample server binary (`ustrace-ctl-sample-server`) with `args` (its module
/// comment lists the roles) and waits for it to print `ready`.
pub fn spawn_sample_server(args: &[&OsStr]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ustrace-ctl-sample-server"))
        .args(args)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("start ustrace-ctl-sample-server");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    match lines.next() {
        Some(Ok(line)) if line == "ready" => {}
        other => panic!("sample server {args:?} exited before it was ready: {other:?}"),
    }
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    child
}

pub fn sigkill(child: &mut Child) {
    // SAFETY: plain kill(2) on a pid we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Fails if the harness of the test binary running this lists anything but tests, e.g. a
/// child role that would count as a passing test that checks nothing; `known` is a test the
/// list must contain, so an empty or broken listing fails too.
pub fn assert_only_tests_listed(known: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--list", "--format", "terse"])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(list.contains(&format!("{known}: test")), "{list}");
    let roles: Vec<_> = list.lines().filter(|l| l.contains("child")).collect();
    assert!(roles.is_empty(), "child roles listed as tests: {roles:?}");
}
