//! Fuzzes a live control-socket connection: arbitrary bytes go to the server loop over a real
//! socket pair, serving an in-memory tracefs. The server must answer or hang up — never
//! panic, never stall past the client's hang-up (a stream read waiting forever included) —
//! and a fresh connection must still be served afterwards.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;
use ustrace_ctl::client::Client;
use ustrace_ctl::memfs::MemFs;
use ustrace_ctl::server::serve_connection;
use ustrace_ctl::vfs::FileSystem;

/// A fresh tree per input: a crash then reproduces from its input alone, and appends do not
/// pile up across millions of runs.
fn fs() -> Arc<dyn FileSystem> {
    Arc::new(MemFs::sample())
}

fn session(input: &[u8]) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let fs = fs();
    let server = std::thread::spawn(move || serve_connection(fs, theirs));
    let mut ours = ours;
    ours.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The server may hang up early (an untrusted length); a failed write is fine then.
    let _ = ours.write_all(input);
    let _ = ours.shutdown(std::net::Shutdown::Write);
    let mut replies = Vec::new();
    if let Err(e) = ours.read_to_end(&mut replies) {
        assert!(
            e.kind() != std::io::ErrorKind::WouldBlock,
            "server stalled: {e}"
        );
    }
    server.join().expect("server connection panicked");
}

fuzz_target!(|data: &[u8]| {
    session(data);
    // Still answering.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let fs = fs();
    let server = std::thread::spawn(move || serve_connection(fs, theirs));
    let mut c = Client::from_stream(ours);
    c.hello().expect("server stopped answering");
    drop(c);
    server.join().unwrap();
});
