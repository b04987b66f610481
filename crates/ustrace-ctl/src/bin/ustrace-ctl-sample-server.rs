//! A process that serves the in-memory sample tracefs ([`MemFs::sample`]) over the control
//! socket, or mounts a served one, and nothing else: the far end the socket and FUSE tests
//! need when a server or a mount must live in another process (to exit, or be killed, while
//! the test watches its socket or mount point).
//!
//! `ustrace-ctl-sample-server serve DIR` serves a socket in `DIR` until killed;
//! `ustrace-ctl-sample-server serve-then-exit DIR` serves, then exits normally at once (the
//! socket must go with it); `ustrace-ctl-sample-server mount SOCKET DIR` mounts the tracefs
//! served at `SOCKET` on `DIR` until killed. Each prints `ready` on stdout once the socket
//! is listening or the mount is in place. Integration tests run it as
//! `env!("CARGO_BIN_EXE_ustrace-ctl-sample-server")`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ustrace_ctl::fuse::{Mount, MountOptions};
use ustrace_ctl::memfs::MemFs;
use ustrace_ctl::server::{self, ServerConfig};

const USAGE: &str = "usage: ustrace-ctl-sample-server serve|serve-then-exit DIR\n       \
                     ustrace-ctl-sample-server mount SOCKET DIR";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [role, dir] if role == "serve" || role == "serve-then-exit" => serve(role, dir),
        [role, socket, dir] if role == "mount" => mount(socket, dir),
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// Mounts the tracefs served at `socket` on `dir` and keeps it mounted until killed, so
/// that a test can see what a killed mount process leaves behind.
fn mount(socket: &str, dir: &str) -> ExitCode {
    // Kept until the process is killed: dropping it would unmount.
    let _mount = match Mount::spawn(Path::new(socket), Path::new(dir), &MountOptions::default()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("ustrace-ctl-sample-server: cannot mount {socket} on {dir}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !say_ready() {
        return ExitCode::FAILURE;
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// `ready` on stdout, flushed: the test reading it waits for nothing else.
fn say_ready() -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").and_then(|()| out.flush()).is_ok()
}

fn serve(role: &str, dir: &str) -> ExitCode {
    let config = ServerConfig {
        socket_dir: Some(dir.into()),
        ..ServerConfig::default()
    };
    let handle = match server::serve_with(Arc::new(MemFs::sample()), config) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("ustrace-ctl-sample-server: cannot serve in {dir}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Leak the handle: only the exit path (atexit, or the signal handler) may remove the
    // socket, which is what the tests check.
    std::mem::forget(handle);
    if !say_ready() {
        return ExitCode::FAILURE;
    }
    if role == "serve-then-exit" {
        // Through exit(3), so the atexit hook runs, as at any normal end of a program.
        std::process::exit(0);
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
