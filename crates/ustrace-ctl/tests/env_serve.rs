//! `USTRACE_SERVE=1` starts serving for programs that cannot add a call. Its own test binary,
//! because it changes this process's environment.

use std::sync::Arc;
use ustrace_ctl::client::Client;
use ustrace_ctl::discover;
use ustrace_ctl::memfs::MemFs;
use ustrace_ctl::server::{serve_from_env, SERVE_ENV};
use ustrace_ctl::vfs::FileSystem;

#[test]
fn serving_follows_the_environment_variable() {
    let dir = std::env::temp_dir().join(format!("ustrace-ctl-env-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var(discover::SOCKET_DIR_ENV, &dir);

    let made = std::sync::atomic::AtomicUsize::new(0);
    let make = || -> Arc<dyn FileSystem> {
        made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Arc::new(MemFs::sample())
    };
    std::env::remove_var(SERVE_ENV);
    assert!(!serve_from_env(make).unwrap());
    std::env::set_var(SERVE_ENV, "0");
    assert!(!serve_from_env(make).unwrap());
    assert_eq!(
        made.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "the tracefs was built although serving was off"
    );

    std::env::set_var(SERVE_ENV, "1");
    assert!(serve_from_env(make).unwrap());
    assert!(serve_from_env(make).unwrap(), "a second call is a no-op");
    assert_eq!(made.load(std::sync::atomic::Ordering::Relaxed), 1);

    let socket = discover::find_socket(std::process::id()).unwrap();
    assert_eq!(socket, dir.join(format!("{}.sock", std::process::id())));
    let mut c = Client::connect(std::process::id()).unwrap();
    assert_eq!(c.read_file("tracing_on").unwrap(), b"1\n");
    let _ = std::fs::remove_dir_all(&dir);
}
