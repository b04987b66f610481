//! Batched patching: dozens of small functions that sit next to each other, many on one page,
//! are patched and restored in one batch (one read and one write per run of neighbouring
//! sites and step of the int3 protocol) while threads keep calling all of them and checking
//! every result. A batch that misplaced a site's bytes in its run, wrote stale bytes between
//! two sites, or left a neighbour's int3 behind shows up as a wrong result, a crash, or a
//! handler that saw the wrong function. USTRACE_STRESS_SECS sets the duration (default 2 s).

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ustrace_fprobe::{EntryAction, Fprobe};

macro_rules! neighbours {
    ($($name:ident = $k:expr),* $(,)?) => {
        $(
            #[no_mangle]
            #[inline(never)]
            pub extern "C" fn $name(x: u64) -> u64 {
                black_box(black_box(x).wrapping_mul($k) ^ ($k << 7))
            }
        )*
        /// (function, its constant), in declaration order.
        const FUNCS: &[(extern "C" fn(u64) -> u64, u64)] = &[$(($name, $k)),*];
    };
}

neighbours!(
    nb_f00 = 3,
    nb_f01 = 5,
    nb_f02 = 7,
    nb_f03 = 11,
    nb_f04 = 13,
    nb_f05 = 17,
    nb_f06 = 19,
    nb_f07 = 23,
    nb_f08 = 29,
    nb_f09 = 31,
    nb_f10 = 37,
    nb_f11 = 41,
    nb_f12 = 43,
    nb_f13 = 47,
    nb_f14 = 53,
    nb_f15 = 59,
    nb_f16 = 61,
    nb_f17 = 67,
    nb_f18 = 71,
    nb_f19 = 73,
    nb_f20 = 79,
    nb_f21 = 83,
    nb_f22 = 89,
    nb_f23 = 97,
    nb_f24 = 101,
    nb_f25 = 103,
    nb_f26 = 107,
    nb_f27 = 109,
    nb_f28 = 113,
    nb_f29 = 127,
    nb_f30 = 131,
    nb_f31 = 137,
    nb_f32 = 139,
    nb_f33 = 149,
    nb_f34 = 151,
    nb_f35 = 157,
    nb_f36 = 163,
    nb_f37 = 167,
    nb_f38 = 173,
    nb_f39 = 179,
);

fn expect(x: u64, k: u64) -> u64 {
    x.wrapping_mul(k) ^ (k << 7)
}

#[derive(Default)]
struct Tally {
    entries: AtomicU64,
    exits: AtomicU64,
    wrong: AtomicU64,
}

#[test]
fn neighbouring_functions_patched_in_one_batch_while_threads_call_them() {
    let mut addrs: Vec<(usize, u64)> = FUNCS.iter().map(|&(f, k)| (f as usize, k)).collect();
    addrs.sort_unstable();
    let shared_pages = addrs
        .windows(2)
        .filter(|w| w[0].0 / 4096 == w[1].0 / 4096)
        .count();
    assert!(
        shared_pages >= FUNCS.len() / 2,
        "the functions are spread out ({shared_pages} neighbours share a page): {addrs:x?}"
    );
    let addrs = Arc::new(addrs);

    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let (stop, calls) = (stop.clone(), calls.clone());
            std::thread::spawn(move || {
                let mut x = t << 40;
                while !stop.load(Ordering::Relaxed) {
                    for &(f, k) in FUNCS {
                        assert_eq!(f(x), expect(x, k), "k={k} x={x}");
                    }
                    x += 1;
                    calls.fetch_add(FUNCS.len() as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();

    let deadline = Instant::now() + Duration::from_secs_f64(common::stress_secs(2.0));
    let mut rounds = 0u64;
    let mut seen = 0u64;
    while Instant::now() < deadline || rounds < 3 {
        let tally = Arc::new(Tally::default());
        let (te, tx) = (tally.clone(), tally.clone());
        let (ae, ax) = (addrs.clone(), addrs.clone());
        let k_of = |addrs: &[(usize, u64)], ip: usize| {
            addrs
                .binary_search_by_key(&ip, |a| a.0)
                .ok()
                .map(|i| addrs[i].1)
        };
        let fp = Fprobe::builder()
            .entry_data_size(16)
            .entry_handler(move |_, ip, _, regs, data| {
                let arg = regs.arg(0).unwrap_or(0);
                if k_of(&ae, ip).is_none() {
                    te.wrong.fetch_add(1, Ordering::Relaxed);
                }
                data[..8].copy_from_slice(&arg.to_le_bytes());
                data[8..].copy_from_slice(&(ip as u64).to_le_bytes());
                te.entries.fetch_add(1, Ordering::Relaxed);
                EntryAction::Continue
            })
            .exit_handler(move |_, ip, _, regs, data| {
                let arg = u64::from_le_bytes(data[..8].try_into().unwrap());
                let entered = u64::from_le_bytes(data[8..].try_into().unwrap()) as usize;
                let ok = entered == ip
                    && k_of(&ax, ip).is_some_and(|k| regs.return_value() == expect(arg, k));
                if !ok {
                    tx.wrong.fetch_add(1, Ordering::Relaxed);
                }
                tx.exits.fetch_add(1, Ordering::Relaxed);
            })
            .register("nb_f*", None)
            .expect("register nb_f*");
        assert_eq!(
            fp.functions().len(),
            FUNCS.len(),
            "refused: {:?}",
            fp.refused()
        );
        std::thread::sleep(Duration::from_millis(3));
        fp.unregister().expect("unregister");
        assert_eq!(
            tally.wrong.load(Ordering::Relaxed),
            0,
            "a handler saw a wrong call"
        );
        assert!(tally.exits.load(Ordering::Relaxed) <= tally.entries.load(Ordering::Relaxed));
        seen += tally.entries.load(Ordering::Relaxed);
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("a worker saw a wrong result");
    }
    eprintln!(
        "batch: {rounds} rounds, {} calls, {seen} seen by handlers",
        calls.load(Ordering::Relaxed)
    );
    assert!(seen > 0, "no call was traced");
}
