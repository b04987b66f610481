//! Static keys: many sites of one key toggled while threads execute them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ustrace_fprobe::static_branch_unlikely;
use ustrace_fprobe::static_key::{jump_entries, StaticKey};

static KEY: StaticKey = StaticKey::new();
static OTHER: StaticKey = StaticKey::new();
static NEVER: StaticKey = StaticKey::new();

macro_rules! sites {
    ($($name:ident = $v:expr),*) => {
        $(
            #[inline(never)]
            fn $name(x: u64) -> u64 {
                if static_branch_unlikely!(KEY) { x.wrapping_mul(3) + $v } else { x + $v }
            }
        )*
        const SITES: &[fn(u64) -> u64] = &[$($name),*];
    };
}
sites!(
    s0 = 0,
    s1 = 1,
    s2 = 2,
    s3 = 3,
    s4 = 4,
    s5 = 5,
    s6 = 6,
    s7 = 7,
    s8 = 8,
    s9 = 9,
    s10 = 10,
    s11 = 11
);

#[inline(never)]
fn other_site() -> bool {
    static_branch_unlikely!(OTHER)
}

#[inline(never)]
fn never_site() -> bool {
    static_branch_unlikely!(NEVER)
}

fn stress_secs() -> f64 {
    std::env::var("USTRACE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0)
}

#[test]
fn table_lists_every_site() {
    let key = &KEY as *const StaticKey as usize;
    let n = jump_entries().iter().filter(|e| e.key == key).count();
    assert!(
        n >= SITES.len(),
        "expected at least {} sites of KEY, table has {n}",
        SITES.len()
    );
}

#[test]
fn toggling_under_load_keeps_results_correct() {
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for t in 0..6u64 {
        let stop = stop.clone();
        let calls = calls.clone();
        threads.push(std::thread::spawn(move || {
            let mut x = t;
            while !stop.load(Ordering::Relaxed) {
                for (i, f) in SITES.iter().enumerate() {
                    let i = i as u64;
                    let r = f(x);
                    assert!(
                        r == x + i || r == x.wrapping_mul(3) + i,
                        "site {i}: f({x}) = {r}"
                    );
                }
                x = x.wrapping_add(1) & 0xffff;
                calls.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs_f64(stress_secs());
    let mut toggles = 0;
    while Instant::now() < deadline {
        KEY.enable();
        assert!(KEY.is_enabled());
        for (i, f) in SITES.iter().enumerate() {
            assert_eq!(
                f(10),
                30 + i as u64,
                "site {i} not taken after enable returned"
            );
        }
        KEY.disable();
        for (i, f) in SITES.iter().enumerate() {
            assert_eq!(
                f(10),
                10 + i as u64,
                "site {i} still taken after disable returned"
            );
        }
        toggles += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("worker panicked");
    }
    assert!(toggles > 5, "only {toggles} toggles");
    assert!(calls.load(Ordering::Relaxed) > 0);
}

#[test]
fn other_key_is_independent() {
    OTHER.enable();
    assert!(other_site());
    assert!(!never_site(), "enabling OTHER must not patch NEVER's site");
    OTHER.disable();
    assert!(!other_site());
}
