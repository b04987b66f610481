//! Stress: 8 threads call probed Rust and C functions while another thread registers and
//! unregisters fprobes on them in a loop. USTRACE_STRESS_SECS sets the duration (default 2 s).

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ustrace_fprobe::{EntryAction, Fprobe};

macro_rules! rust_fns {
    ($($name:ident = $k:expr),*) => {
        $(
            #[no_mangle]
            #[inline(never)]
            pub extern "C" fn $name(x: u64) -> u64 {
                let mut v = black_box(x);
                v = v.wrapping_mul($k).rotate_left(5) ^ 0x9e37;
                black_box(v)
            }
        )*
    };
}
rust_fns!(st_r0 = 3, st_r1 = 5, st_r2 = 7, st_r3 = 11, st_r4 = 13);

fn expect_r(x: u64, k: u64) -> u64 {
    x.wrapping_mul(k).rotate_left(5) ^ 0x9e37
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn st_rec(n: u64) -> u64 {
    if black_box(n) == 0 {
        return 1;
    }
    st_rec(n - 1) + st_r0(n)
}

fn expect_rec(n: u64) -> u64 {
    if n == 0 {
        1
    } else {
        expect_rec(n - 1) + expect_r(n, 3)
    }
}

fn gettid() -> u64 {
    // SAFETY: no arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

#[derive(Default)]
struct Tally {
    unregistered: AtomicBool,
    entries: AtomicU64,
    exits: AtomicU64,
    after_unregister: AtomicU64,
    mismatched: AtomicU64,
}

/// An fprobe whose entry stores (tid, arg0) in entry_data and whose exit checks them.
fn checked_probe(tally: &Arc<Tally>, syms: &[&str]) -> Fprobe {
    let (t1, t2) = (tally.clone(), tally.clone());
    Fprobe::builder()
        .entry_data_size(16)
        .entry_handler(move |_, _, _, regs, data| {
            if t1.unregistered.load(Ordering::Acquire) {
                t1.after_unregister.fetch_add(1, Ordering::Relaxed);
            }
            data[..8].copy_from_slice(&gettid().to_le_bytes());
            data[8..].copy_from_slice(&regs.arg(0).unwrap_or(0).to_le_bytes());
            t1.entries.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .exit_handler(move |_, _, _, _, data| {
            if t2.unregistered.load(Ordering::Acquire) {
                t2.after_unregister.fetch_add(1, Ordering::Relaxed);
            }
            if u64::from_le_bytes(data[..8].try_into().unwrap()) != gettid() {
                t2.mismatched.fetch_add(1, Ordering::Relaxed);
            }
            t2.exits.fetch_add(1, Ordering::Relaxed);
        })
        .register_syms(syms)
        .unwrap_or_else(|e| panic!("register {syms:?}: {e}"))
}

#[test]
fn register_unregister_while_eight_threads_call() {
    let lib = common::c_lib();
    type F1 = extern "C" fn(u64) -> u64;
    type F2 = extern "C" fn(u64, u64) -> u64;
    // SAFETY: signatures match tests/c/probed.c.
    let c_fns: Option<(F2, F1)> = lib.map(|l| unsafe {
        (
            std::mem::transmute::<usize, F2>(l.sym("c_add")),
            std::mem::transmute::<usize, F1>(l.sym("c_fib")),
        )
    });
    let mut stable_syms = vec!["st_r0", "st_r1", "st_rec"];
    let mut churn_syms = vec!["st_r2", "st_r3", "st_r4", "st_r0"];
    if c_fns.is_some() {
        stable_syms.push("c_fib");
        churn_syms.push("c_add");
    }

    // Attached for the whole run: its counts must balance exactly once the workers stop.
    let stable_tally = Arc::new(Tally::default());
    let stable = checked_probe(&stable_tally, &stable_syms);

    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for t in 0..8u64 {
        let (stop, calls) = (stop.clone(), calls.clone());
        workers.push(std::thread::spawn(move || {
            let mut x = t * 1000;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(st_r0(x), expect_r(x, 3));
                assert_eq!(st_r1(x), expect_r(x, 5));
                assert_eq!(st_r2(x), expect_r(x, 7));
                assert_eq!(st_r3(x), expect_r(x, 11));
                assert_eq!(st_r4(x), expect_r(x, 13));
                assert_eq!(st_rec(x % 8), expect_rec(x % 8));
                if let Some((c_add, c_fib)) = c_fns {
                    assert_eq!(c_add(x, 7), x + 7);
                    assert_eq!(
                        c_fib(x % 10),
                        [0, 1, 1, 2, 3, 5, 8, 13, 21, 34][(x % 10) as usize]
                    );
                }
                x += 1;
                calls.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    let deadline = Instant::now() + Duration::from_secs_f64(common::stress_secs(2.0));
    let mut rounds = 0u64;
    let mut churn_total = (0u64, 0u64);
    let (mut reg_time, mut unreg_time) = (Duration::ZERO, Duration::ZERO);
    // At least three rounds however loaded the machine: each round's checks are the point,
    // and the deadline only says how many more to run.
    while rounds < 3 || Instant::now() < deadline {
        let a = Arc::new(Tally::default());
        let b = Arc::new(Tally::default());
        let t0 = Instant::now();
        let fa = checked_probe(&a, &churn_syms);
        reg_time = reg_time.max(t0.elapsed());
        let fb = checked_probe(&b, &stable_syms);
        std::thread::sleep(Duration::from_millis(2));
        let t0 = Instant::now();
        fa.unregister().expect("unregister a");
        unreg_time = unreg_time.max(t0.elapsed());
        a.unregistered.store(true, Ordering::Release);
        drop(fb);
        b.unregistered.store(true, Ordering::Release);
        std::thread::sleep(Duration::from_millis(1));
        for t in [&a, &b] {
            assert_eq!(
                t.after_unregister.load(Ordering::Relaxed),
                0,
                "handler ran after unregister returned"
            );
            assert_eq!(
                t.mismatched.load(Ordering::Relaxed),
                0,
                "exit ran on another thread than its entry"
            );
            assert!(t.exits.load(Ordering::Relaxed) <= t.entries.load(Ordering::Relaxed));
        }
        churn_total.0 += a.entries.load(Ordering::Relaxed) + b.entries.load(Ordering::Relaxed);
        churn_total.1 += a.exits.load(Ordering::Relaxed) + b.exits.load(Ordering::Relaxed);
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker failed");
    }
    let (n, x, missed) = (
        stable_tally.entries.load(Ordering::Relaxed),
        stable_tally.exits.load(Ordering::Relaxed),
        stable.nmissed(),
    );
    stable.unregister().unwrap();
    eprintln!(
        "stress: {rounds} register/unregister rounds (slowest patching register {reg_time:?}, unregister {unreg_time:?}), {} worker iterations, stable probe {n} entries / {x} exits / {missed} missed, churn probes {} entries / {} exits",
        calls.load(Ordering::Relaxed),
        churn_total.0,
        churn_total.1
    );
    assert!(rounds >= 3, "only {rounds} rounds");
    assert!(calls.load(Ordering::Relaxed) > 0);
    assert!(n > 0);
    assert_eq!(stable_tally.mismatched.load(Ordering::Relaxed), 0);
    // Every call completed, so every entry that armed an exit got it.
    assert_eq!(n, x + missed, "entries {n} != exits {x} + missed {missed}");
    assert!(churn_total.0 > 0);
    assert_eq!(ustrace_fprobe::outstanding_frames(), 0);
}
