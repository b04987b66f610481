//! Measures what a shell user waits for: one control-socket round trip, a whole `cat` of a
//! small file over the socket, and the same through a FUSE mount (when run as root).
//!
//! `cargo run --release -p ustrace-ctl --example ctl_roundtrip`

use std::sync::Arc;
use std::time::Instant;
use ustrace_ctl::client::Client;
use ustrace_ctl::fuse::{Mount, MountOptions};
use ustrace_ctl::memfs::MemFs;
use ustrace_ctl::server::{self, ServerConfig};

fn per_op(label: &str, n: u32, mut f: impl FnMut()) {
    for _ in 0..n / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    println!("{label:<44} {us:>8.1} us/op  ({n} ops)");
}

fn main() {
    let root = std::env::temp_dir().join(format!("ustrace-ctl-rt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let fs = Arc::new(MemFs::sample());
    let config = ServerConfig {
        socket_dir: Some(root.join("sock")),
        ..Default::default()
    };
    let handle = server::serve_with(fs.clone(), config).unwrap();
    let mut c = Client::connect_path(handle.socket_path()).unwrap();

    per_op("socket: hello (one round trip)", 20_000, || {
        c.hello().unwrap();
    });
    per_op("socket: stat", 20_000, || {
        c.stat("events/sched/sched_switch/enable").unwrap();
    });
    per_op("socket: write_file (echo 1 > enable)", 20_000, || {
        c.write_file("events/sched/sched_switch/enable", b"1", false)
            .unwrap();
    });
    per_op(
        "socket: read_file (cat format, 4 round trips)",
        10_000,
        || {
            c.read_file("events/sched/sched_switch/format").unwrap();
        },
    );
    per_op("socket: new connection + hello", 2_000, || {
        Client::connect_path(handle.socket_path())
            .unwrap()
            .hello()
            .unwrap();
    });

    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 && std::path::Path::new("/dev/fuse").exists() {
        let dir = root.join("mnt");
        std::fs::create_dir_all(&dir).unwrap();
        let m = Mount::spawn(handle.socket_path(), &dir, &MountOptions::default()).unwrap();
        let format = dir.join("events/sched/sched_switch/format");
        let enable = dir.join("events/sched/sched_switch/enable");
        per_op("fuse: read whole format file (cat)", 2_000, || {
            std::fs::read(&format).unwrap();
        });
        per_op("fuse: write enable (echo 1 >)", 2_000, || {
            std::fs::write(&enable, b"1").unwrap();
        });
        drop(m);
    } else {
        println!("fuse: skipped (needs root and /dev/fuse)");
    }
    drop(handle);
    let _ = std::fs::remove_dir_all(&root);
}
