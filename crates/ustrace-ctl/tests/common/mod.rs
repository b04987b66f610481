//! Helpers shared by the control-socket and FUSE tests: private socket directories, an
//! in-memory tracefs served with a captured log, and child processes (this same test binary
//! re-run in a "child" role) for the cases that need a process to die.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use ustrace_ctl::memfs::MemFs;
use ustrace_ctl::server::{self, ServerConfig, ServerHandle};

/// The env var that tells a re-run test binary which child role to play.
pub const CHILD_ENV: &str = "USTRACE_CTL_TEST_CHILD";

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

/// Re-runs this test binary as a child playing `role` (see each test file's `child_main`),
/// and waits for it to print `ready`.
pub fn spawn_child(test_name: &str, role: &str) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        match lines.next() {
            // libtest prints "test NAME ... " first, on the same line.
            Some(Ok(line)) if line.trim_end().ends_with("ready") => break,
            Some(Ok(_)) => continue,
            _ => panic!("child {role} exited before it was ready"),
        }
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
