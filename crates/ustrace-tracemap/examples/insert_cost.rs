//! Cost of the hist update path: `insert` + two `add`s on a warm map.
//!
//! `cargo run --release -p ustrace-tracemap --example insert_cost [iterations]` prints ns/op
//! (and the lookup alone, to show what the atomic adds cost) for one hot key and for 1000 keys
//! visited in a scattered order, with 8-byte and 24-byte (three-field compound) keys; then the
//! same update from two threads at once on one shared key and on 1000 shared keys, where the
//! cost of cache lines moving between CPUs shows. Times are thread CPU time, so time spent
//! preempted on a shared machine is not counted.

use std::hint::black_box;
use ustrace_tracemap::{MapConfig, TracingMap};

/// Nanoseconds of CPU this thread has used.
fn cpu_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

fn run<const N: usize>(label: &str, keys: &[[u8; N]], iters: usize) {
    let map = TracingMap::new(MapConfig {
        max_elts: 2048,
        key_size: N,
        n_vals: 2,
        n_vars: 0,
    })
    .expect("map");
    // Warm: every key claimed, table and elements in cache.
    for k in keys {
        map.insert(k).expect("room").add(0, 1);
    }
    let t = cpu_ns();
    // The key index wraps by compare, not `%`: a division would cost as much as the update.
    let mut j = 0;
    for i in 0..iters {
        let key = black_box(&keys[j]);
        j += 1;
        if j == keys.len() {
            j = 0;
        }
        let e = map.insert(key).expect("claimed");
        e.add(0, 1);
        e.add(1, black_box(i as u64));
    }
    let update = (cpu_ns() - t) as f64 / iters as f64;
    let t = cpu_ns();
    for _ in 0..iters {
        black_box(map.lookup(black_box(&keys[j])));
        j += 1;
        if j == keys.len() {
            j = 0;
        }
    }
    let find = (cpu_ns() - t) as f64 / iters as f64;
    println!("{label:<28} insert+2 adds {update:6.2} ns/op   lookup alone {find:6.2} ns/op");
    assert_eq!(map.len(), keys.len());
}

fn keys<const N: usize>(n: usize) -> Vec<[u8; N]> {
    // Scatter the visiting order so that consecutive updates hit unrelated slots.
    (0..n)
        .map(|i| {
            let v = ((i * 613) % n) as u64;
            let mut k = [0u8; N];
            for (j, chunk) in k.chunks_mut(8).enumerate() {
                let w = (v + j as u64).to_ne_bytes();
                chunk.copy_from_slice(&w[..chunk.len()]);
            }
            k
        })
        .collect()
}

fn main() {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000_000);
    run("1 key, 8-byte key", &keys::<8>(1), iters);
    run("1000 keys, 8-byte key", &keys::<8>(1000), iters);
    run("1 key, 24-byte key", &keys::<24>(1), iters);
    run("1000 keys, 24-byte key", &keys::<24>(1000), iters);
    run("1000 keys, 12-byte key", &keys::<12>(1000), iters);
    run_threads("2 threads, 1 shared key", &keys::<8>(1), iters / 4);
    run_threads("2 threads, 1000 shared keys", &keys::<8>(1000), iters / 4);
}

/// Two threads updating the same map at once; prints the mean CPU ns per update per thread.
fn run_threads(label: &str, keys: &[[u8; 8]], iters: usize) {
    let map = TracingMap::new(MapConfig {
        max_elts: 2048,
        key_size: 8,
        n_vals: 2,
        n_vars: 0,
    })
    .expect("map");
    for k in keys {
        map.insert(k).expect("room");
    }
    let start = std::sync::Barrier::new(2);
    let per_thread: Vec<f64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|t| {
                let (map, start) = (&map, &start);
                s.spawn(move || {
                    start.wait();
                    let t0 = cpu_ns();
                    // The threads walk the keys from opposite ends' halves.
                    let mut j = t * keys.len() / 2;
                    for i in 0..iters {
                        let e = map.insert(black_box(&keys[j])).expect("claimed");
                        e.add(0, 1);
                        e.add(1, i as u64);
                        j += 1;
                        if j == keys.len() {
                            j = 0;
                        }
                    }
                    (cpu_ns() - t0) as f64 / iters as f64
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mean = per_thread.iter().sum::<f64>() / per_thread.len() as f64;
    let mut hits = 0;
    map.for_each(|e| hits += e.val(0));
    assert_eq!(hits, 2 * iters as u64);
    println!("{label:<28} insert+2 adds {mean:6.2} ns/op per thread");
}
