//! A process that serves the in-memory sample tracefs ([`MemFs::sample`]) over the control
//! socket and nothing else: the far end the socket tests need when the server must live in
//! another process (to exit, or be killed, while the test watches its socket).
//!
//! `ustrace-ctl-sample-server serve DIR` serves a socket in `DIR` until killed;
//! `ustrace-ctl-sample-server serve-then-exit DIR` serves, then exits normally at once (the
//! socket must go with it). Both print `ready` on stdout once the socket is listening.
//! Integration tests run it as `env!("CARGO_BIN_EXE_ustrace-ctl-sample-server")`.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ustrace_ctl::memfs::MemFs;
use ustrace_ctl::server::{self, ServerConfig};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [role, dir] = args.as_slice() else {
        eprintln!("usage: ustrace-ctl-sample-server serve|serve-then-exit DIR");
        return ExitCode::from(2);
    };
    if role != "serve" && role != "serve-then-exit" {
        eprintln!("ustrace-ctl-sample-server: unknown role {role:?}");
        return ExitCode::from(2);
    }
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
    let mut out = std::io::stdout().lock();
    if writeln!(out, "ready").and_then(|()| out.flush()).is_err() {
        return ExitCode::FAILURE;
    }
    drop(out);
    if role == "serve-then-exit" {
        // Through exit(3), so the atexit hook runs, as at any normal end of a program.
        std::process::exit(0);
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
