//! A thread's first probe hit claims its quiescence slot, which calls into libc; with libc's
//! own functions probed (as `function_graph` on every function does), that claim must not
//! re-enter the dispatcher it is setting up (it recursed until the stack overflowed).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ustrace_fprobe::{EntryAction, Fprobe};

#[test]
fn a_first_hit_inside_probed_libc_claims_its_slot_without_recursing() {
    let inv = ustrace_inspect::symbols::inventory();
    let libc_fns: Vec<usize> = inv
        .functions()
        .iter()
        .filter(|s| {
            s.object_name().starts_with("libc.so")
                && ["syscall", "pthread_setspecific", "pthread_getspecific"].contains(&&*s.name)
        })
        .map(|s| s.addr)
        .collect();
    if libc_fns.is_empty() {
        println!("skipped: libc's syscall/pthread_setspecific not found");
        return;
    }
    let (hits, exits) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (h, x) = (hits.clone(), exits.clone());
    let fp = Fprobe::builder()
        .entry_handler(move |_, _, _, _, _| {
            h.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .exit_handler(move |_, _, _, _, _| {
            x.fetch_add(1, Ordering::Relaxed);
        })
        .register_ips_lenient(&libc_fns)
        .expect("register");
    assert!(
        !fp.functions().is_empty(),
        "nothing patched: {:?}",
        fp.refused()
    );
    // Fresh threads: each one's first dispatcher entry is a hit in probed libc code.
    for _ in 0..4 {
        std::thread::spawn(|| {
            // SAFETY: gettid through libc's syscall(); no arguments.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) };
            assert!(tid > 0);
        })
        .join()
        .expect("thread");
    }
    let missed = fp.nmissed();
    drop(fp);
    assert!(hits.load(Ordering::Relaxed) >= 4, "hits {hits:?}");
    assert_eq!(
        hits.load(Ordering::Relaxed),
        exits.load(Ordering::Relaxed) + missed,
        "missed {missed}"
    );
}
