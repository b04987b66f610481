//! More threads than cores hammering one map: hot keys whose first insert races in every
//! thread, a key space larger than the pool so that it fills and drops, and variables taken by
//! racing threads. Runs for `USTRACE_STRESS_SECS` (default 1 s).

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use ustrace_tracemap::{MapConfig, TracingMap};

const THREADS: usize = 8;
const MAX_ELTS: usize = 1024;
const KEYS: usize = 1536;
const HOT: usize = 4;
const OPS: usize = 20_000;
const KEY_SIZE: usize = 12;

fn stress_duration() -> Duration {
    let secs = std::env::var("USTRACE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(secs.clamp(0.1, 600.0))
}

fn key(k: usize) -> [u8; KEY_SIZE] {
    let mut b = [0u8; KEY_SIZE];
    b[..8].copy_from_slice(&(k as u64).wrapping_mul(0x1000_0001).to_ne_bytes());
    b[8..].copy_from_slice(&(k as u32).to_ne_bytes());
    b
}

/// What one thread did: successful adds per key, and how many inserts returned `None`.
struct Tally {
    adds: Vec<u64>,
    nones: u64,
}

fn run_round(map: &Arc<TracingMap>, round: u64) -> Vec<Tally> {
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let map = Arc::clone(map);
            let start = Arc::clone(&start);
            // Seeded before spawning: a thread failing before the barrier would hang the rest.
            let mut x = (round << 8 | t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            std::thread::spawn(move || {
                let mut tally = Tally {
                    adds: vec![0; KEYS],
                    nones: 0,
                };
                start.wait();
                for i in 0..OPS {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // The first ops of every thread go to the hot keys so their claims race.
                    let k = if i < HOT * 4 || x & 1 == 0 {
                        (x as usize >> 8) % HOT
                    } else {
                        (x as usize >> 8) % KEYS
                    };
                    match map.insert(&key(k)) {
                        Some(e) => {
                            e.add(0, 1);
                            e.add(1, k as u64 + 1);
                            tally.adds[k] += 1;
                        }
                        None => tally.nones += 1,
                    }
                }
                tally
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn concurrent_inserts_count_every_add_and_claim_each_key_once() {
    let map = Arc::new(
        TracingMap::new(MapConfig {
            max_elts: MAX_ELTS,
            key_size: KEY_SIZE,
            n_vals: 2,
            n_vars: 0,
        })
        .unwrap(),
    );
    let deadline = Instant::now() + stress_duration();
    let mut rounds = 0u64;
    while rounds == 0 || Instant::now() < deadline {
        let tallies = run_round(&map, rounds);
        let total_adds: u64 = tallies.iter().flat_map(|t| t.adds.iter()).sum();
        let total_nones: u64 = tallies.iter().map(|t| t.nones).sum();
        assert_eq!(total_adds + total_nones, (THREADS * OPS) as u64);

        // No key claimed twice, and for_each sees exactly the claimed elements.
        let mut keys = HashSet::new();
        let mut sum_hits = 0;
        map.for_each(|e| {
            assert!(
                keys.insert(e.key().to_vec()),
                "key claimed twice: {:?}",
                e.key()
            );
            sum_hits += e.val(0);
        });
        assert_eq!(keys.len(), map.len());
        assert_eq!(sum_hits, total_adds, "sum of all vals == number of adds");
        assert_eq!(map.drops(), total_nones, "every None is a counted drop");
        assert!(map.len() <= MAX_ELTS);
        assert!(
            total_nones == 0 || map.len() == MAX_ELTS,
            "drops only when full"
        );

        for k in 0..KEYS {
            let adds: u64 = tallies.iter().map(|t| t.adds[k]).sum();
            match map.lookup(&key(k)) {
                Some(e) => {
                    assert_eq!(e.val(0), adds, "key {k}");
                    assert_eq!(e.val(1), adds * (k as u64 + 1), "key {k}");
                }
                None => assert_eq!(adds, 0, "key {k} added to but not found"),
            }
        }
        // Writers are stopped: clear and reuse the same memory next round.
        map.clear();
        assert_eq!((map.len(), map.drops()), (0, 0));
        rounds += 1;
    }
    eprintln!("{rounds} rounds of {THREADS}x{OPS} inserts");
}

#[test]
fn racing_take_var_hands_each_value_out_once() {
    const ELTS: usize = 256;
    let map = Arc::new(
        TracingMap::new(MapConfig {
            max_elts: ELTS,
            key_size: 8,
            n_vals: 0,
            n_vars: 2,
        })
        .unwrap(),
    );
    for k in 0..ELTS as u64 {
        map.insert(&k.to_ne_bytes()).unwrap();
    }
    let deadline = Instant::now() + stress_duration() / 2;
    let mut rounds = 0u64;
    while rounds == 0 || Instant::now() < deadline {
        map.for_each(|e| e.set_var(1, rounds));
        let start = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let map = Arc::clone(&map);
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    start.wait();
                    let mut got = 0u64;
                    // Threads walk the keys from different starting points so they collide.
                    for i in 0..ELTS {
                        let k = ((i + t * 37) % ELTS) as u64;
                        if let Some(v) = map.lookup(&k.to_ne_bytes()).unwrap().take_var(1) {
                            assert_eq!(v, rounds);
                            got += 1;
                        }
                    }
                    got
                })
            })
            .collect();
        let taken: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(taken, ELTS as u64, "each set variable taken exactly once");
        map.for_each(|e| assert_eq!(e.var(1), None));
        rounds += 1;
    }
}

/// `clear` while writers run (the map allows it, whatever its user does): afterwards, with the
/// writers stopped, the map must still be consistent — every published element reached once,
/// under its own key, and `len` counting exactly those.
#[test]
fn clear_racing_writers_leaves_a_consistent_map() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let map = Arc::new(
        TracingMap::new(MapConfig {
            max_elts: 64,
            key_size: KEY_SIZE,
            n_vals: 1,
            n_vars: 0,
        })
        .unwrap(),
    );
    let deadline = Instant::now() + stress_duration();
    let mut rounds = 0u64;
    while rounds == 0 || Instant::now() < deadline {
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let map = Arc::clone(&map);
                let stop = Arc::clone(&stop);
                let mut x = (rounds << 8 | t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        // About twice as many keys as elements: claims never stop.
                        if let Some(e) = map.insert(&key((x >> 8) as usize % 128)) {
                            e.add(0, 1);
                        }
                    }
                })
            })
            .collect();
        // Back to back, so that clears overlap the claims that refill the map.
        for _ in 0..2000 {
            map.clear();
        }
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
        let mut keys = HashSet::new();
        let mut elts = HashSet::new();
        let mut n = 0;
        map.for_each(|e| {
            n += 1;
            assert!(
                elts.insert(e as *const _ as *const u8 as usize),
                "element in two slots"
            );
            assert!(keys.insert(e.key().to_vec()), "key claimed twice");
            let found = map.lookup(&e.key()).expect("published key found");
            assert!(std::ptr::eq(found, e), "lookup reaches another element");
        });
        assert_eq!(n, map.len(), "len counts exactly the published elements");
        map.clear();
        rounds += 1;
    }
}
