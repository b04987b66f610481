//! A process that serves the in-memory sample tracefs ([`MemFs::sample`]) over the control
//! socket, or mounts a served one, and nothing else: the far end the socket and FUSE tests
//! need when a server or a mount must live in another process (to exit, or be killed, while
//! the test watches its socket or mount point).
//!
//! `ustrace-ctl-sample-server serve DIR` serves a socket in `DIR` until killed;
//! `ustrace-ctl-sample-server serve-then-exit DIR` serves, then exits normally at once (the
//! socket must go with it); `ustrace-ctl-sample-server mount SOCKET DIR` mounts the tracefs
//! served at `SOCKET` on `DIR` until killed. Each prints `ready` on stdout once the socket
//! is listening or the mount is in place.
//!
//! Two roles serve until their stdin says so, printing `ready SOCKET`: `emfile DIR` serves
//! in `DIR`, then uses up every file descriptor (a limit of 64) until a first line on stdin,
//! gives them back and prints `released`, and ends at a second line or end of input;
//! `default` serves from the default directory (whatever its environment makes it) and
//! ends at a line or end of input, removing what it made.
//!
//! Integration tests run it as `env!("CARGO_BIN_EXE_ustrace-ctl-sample-server")`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ustrace_ctl::fuse::{Mount, MountOptions};
use ustrace_ctl::memfs::MemFs;
use ustrace_ctl::server::{self, ServerConfig};

const USAGE: &str = "usage: ustrace-ctl-sample-server serve|serve-then-exit|emfile DIR\n       \
                     ustrace-ctl-sample-server mount SOCKET DIR\n       \
                     ustrace-ctl-sample-server default";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [role, dir] if role == "serve" || role == "serve-then-exit" => serve(role, dir),
        [role, socket, dir] if role == "mount" => mount(socket, dir),
        [role, dir] if role == "emfile" => out_of_fds(dir),
        [role] if role == "default" => serve_default(),
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

/// Serves in `dir`, then holds every file descriptor it may open until told (see the
/// module comment), so that a test can see the server answer when it cannot accept.
fn out_of_fds(dir: &str) -> ExitCode {
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
    let limit = libc::rlimit {
        rlim_cur: 64,
        rlim_max: 64,
    };
    // SAFETY: setrlimit reads a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        eprintln!(
            "ustrace-ctl-sample-server: setrlimit: {}",
            std::io::Error::last_os_error()
        );
        return ExitCode::FAILURE;
    }
    let mut hog = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => hog.push(f),
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
            Err(e) => {
                eprintln!("ustrace-ctl-sample-server: open /dev/null: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if !say(&format!("ready {}", handle.socket_path().display())) {
        return ExitCode::FAILURE;
    }
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(hog);
    if !say("released") {
        return ExitCode::FAILURE;
    }
    let _ = std::io::stdin().read_line(&mut line);
    ExitCode::SUCCESS
}

/// Serves from the default socket directory until told (see the module comment); the
/// handle is dropped at the end, so the server removes what it made.
fn serve_default() -> ExitCode {
    let handle = match server::serve(Arc::new(MemFs::sample())) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("ustrace-ctl-sample-server: cannot serve: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !say(&format!("ready {}", handle.socket_path().display())) {
        return ExitCode::FAILURE;
    }
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(handle);
    ExitCode::SUCCESS
}

/// `line` on stdout, flushed: the test reading it waits for nothing else.
fn say(line: &str) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

/// `ready` on stdout, flushed: the test reading it waits for nothing else.
fn say_ready() -> bool {
    say("ready")
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
