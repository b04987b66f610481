//! Many clients at once, more threads than cores, for `USTRACE_STRESS_SECS` (default 1 s):
//! readers, writers, mkdir/rmdir, stream readers fed by pushers, clients that hang up in the
//! middle of a request and clients that send garbage. The server must keep answering, lose no
//! pushed byte, and free every connection once its client is gone.

mod common;

use common::serve_sample;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ustrace_ctl::client::{Client, CtlError};
use ustrace_ctl::proto::{self, Request};
use ustrace_ctl::vfs::{Errno, OpenFlags};

fn stress_duration() -> Duration {
    let secs = std::env::var("USTRACE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(secs.clamp(0.1, 600.0))
}

#[test]
fn the_server_survives_a_crowd() {
    let s = serve_sample();
    let path = s.handle.socket_path().to_owned();
    let until = Instant::now() + stress_duration();
    let stop = Arc::new(AtomicBool::new(false));
    let pushed = Arc::new(AtomicU64::new(0));
    let received = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    // Rude readers consume from a pipe of their own: bytes a reader took before hanging up
    // are gone, as on the kernel, and must not spoil the accounting of trace_pipe.
    s.fs.add_stream("rude_pipe", 0o444);

    // Pusher: feeds trace_pipe as a tracer would.
    {
        let (fs, stop, pushed) = (s.fs.clone(), stop.clone(), pushed.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                fs.push("trace_pipe", b"0123456789abcdef").unwrap();
                fs.push("rude_pipe", b"x").unwrap();
                pushed.fetch_add(16, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        }));
    }
    // Two stream readers.
    for _ in 0..2 {
        let (path, stop, received) = (path.clone(), stop.clone(), received.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Client::connect_path(&path).unwrap();
            let pipe = c.open("trace_pipe", OpenFlags::READ).unwrap();
            while !stop.load(Ordering::Relaxed) {
                match c.read(pipe.handle, 4096, Some(Duration::from_millis(50))) {
                    Ok(d) => {
                        received.fetch_add(d.len() as u64, Ordering::Relaxed);
                    }
                    Err(CtlError::Remote { errno, .. }) if errno == Errno::EAGAIN => {}
                    Err(e) => panic!("stream read failed: {e}"),
                }
            }
            // Drain what is left so every pushed byte is accounted for.
            while let Ok(d) = c.read(pipe.handle, 1 << 16, Some(Duration::from_millis(100))) {
                received.fetch_add(d.len() as u64, Ordering::Relaxed);
            }
        }));
    }
    // Workers doing everything else, each in its own instance.
    for i in 0..8 {
        let (path, stop) = (path.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Client::connect_path(&path).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let dir = format!("instances/w{i}");
                c.mkdir(&dir).unwrap();
                let v = if n.is_multiple_of(2) { "0" } else { "1" };
                c.write_file(&format!("{dir}/tracing_on"), v.as_bytes(), false)
                    .unwrap();
                assert_eq!(
                    c.read_file(&format!("{dir}/tracing_on")).unwrap(),
                    v.as_bytes()
                );
                assert!(!c.readdir("").unwrap().is_empty());
                c.stat("events/sched/sched_switch/format").unwrap();
                c.rmdir(&dir).unwrap();
                n += 1;
            }
            assert!(n > 0);
        }));
    }
    // Rude clients: hang up mid-frame, mid-stream-read, or send garbage.
    for kind in 0..3u8 {
        let (path, stop) = (path.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut k = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let mut c = Client::connect_path(&path).unwrap();
                match kind {
                    0 => {
                        let f = Request::Stat {
                            path: "trace".into(),
                        }
                        .encode();
                        c.send_raw(&f[..f.len() - 1]).unwrap();
                    }
                    1 => {
                        let pipe = c.open("rude_pipe", OpenFlags::READ).unwrap();
                        let r = Request::Read {
                            handle: pipe.handle,
                            max: 1,
                            wait_ms: proto::WAIT_FOREVER,
                        };
                        c.send_raw(&r.encode()).unwrap();
                    }
                    _ => {
                        let junk = [4, 0, 0, 0, proto::VERSION, (k % 256) as u8, 0xff, 0x01];
                        c.send_raw(&junk).unwrap();
                        let _ = c.recv_reply();
                    }
                }
                k += 1;
                drop(c);
                std::thread::sleep(Duration::from_millis(1));
            }
        }));
    }

    while Instant::now() < until {
        // The server answers a fresh client throughout.
        let mut c = Client::connect_path(&path).unwrap();
        c.hello().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        received.load(Ordering::Relaxed),
        pushed.load(Ordering::Relaxed),
        "bytes lost or duplicated on trace_pipe"
    );
    let deadline = Instant::now() + Duration::from_secs(3);
    while s.handle.active_connections() != 0 {
        assert!(
            Instant::now() < deadline,
            "{} connections never freed",
            s.handle.active_connections()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
