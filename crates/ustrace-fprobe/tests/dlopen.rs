//! A filter registered before a library is loaded attaches to it when dlopen returns.
//!
//! Documented behaviour: after `dlopen`/`dlmopen` returns (before its caller resumes), every
//! filter-registered fprobe is re-applied to the newly loaded functions; calls made during the
//! load itself (library constructors) are not probed. `Fprobe::rescan()` does the same by hand.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ustrace_fprobe::{EntryAction, Fprobe};

#[test]
fn filter_registered_before_dlopen_covers_the_new_library() {
    let Some(path) = common::build_lib("late", "late_dlopen_test", &["-O1"]) else {
        return;
    };
    // c_lib provides an already-loaded match so the registration itself succeeds.
    let Some(_lib) = common::c_lib() else { return };
    let hits = Arc::new(AtomicU64::new(0));
    let exits = Arc::new(AtomicU64::new(0));
    let (h, x) = (hits.clone(), exits.clone());
    let fp = Fprobe::builder()
        .entry_handler(move |_, _, _, regs, _| {
            if regs.arg(0) == Some(9) {
                h.fetch_add(1, Ordering::Relaxed);
            }
            EntryAction::Continue
        })
        .exit_handler(move |_, _, _, regs, _| {
            if regs.return_value() == 81 {
                x.fetch_add(1, Ordering::Relaxed);
            }
        })
        .register("dl_late_* c_add", None)
        .unwrap();
    assert_eq!(fp.functions().len(), 1);
    let hooked = ustrace_fprobe::dlopen_hook_status();
    assert!(
        hooked.iter().any(|(_, _, e)| e.is_none()),
        "dlopen not hooked: {hooked:?}"
    );

    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: loading the library we just built.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null());
    // Attached by the time dlopen returned.
    assert_eq!(fp.functions().len(), 2, "refused: {:?}", fp.refused());
    // SAFETY: symbol from the library just loaded.
    let sym = unsafe { libc::dlsym(h, c"dl_late_square".as_ptr()) };
    assert!(!sym.is_null());
    // SAFETY: signature matches tests/c/late.c.
    let square: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(sym) };
    assert_eq!(square(9), 81);
    assert_eq!(
        (hits.load(Ordering::Relaxed), exits.load(Ordering::Relaxed)),
        (1, 1)
    );
    assert!(ustrace_fprobe::enabled_functions().contains("dl_late_square (1)"));
    // Nothing new to attach on a manual rescan.
    assert_eq!(fp.rescan().unwrap(), 0);
    drop(fp);
    assert_eq!(square(9), 81);
    assert_eq!(hits.load(Ordering::Relaxed), 1);
}
