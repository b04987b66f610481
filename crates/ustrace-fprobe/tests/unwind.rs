//! Unwinding through probed frames: Rust panics, backtraces, pthread_exit.

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ustrace_fprobe::{EntryAction, Fprobe};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[no_mangle]
#[inline(never)]
pub extern "C-unwind" fn uw_panicker(x: u64) -> u64 {
    let v = black_box(x);
    if v == 13 {
        panic!("unlucky {v}");
    }
    v * 2
}

#[no_mangle]
#[inline(never)]
pub extern "C-unwind" fn uw_outer(x: u64) -> u64 {
    let v = black_box(x);
    uw_panicker(v) + 1
}

#[no_mangle]
#[inline(never)]
pub fn uw_bt_inner(x: u64) -> String {
    let _ = black_box(x);
    std::backtrace::Backtrace::force_capture().to_string()
}

#[no_mangle]
#[inline(never)]
pub fn uw_bt_outer(x: u64) -> String {
    let s = uw_bt_inner(black_box(x));
    black_box(s)
}

/// Captures the stack the way the `stacktrace` trigger does and names each frame.
#[no_mangle]
#[inline(never)]
pub fn uw_cap_inner(x: u64) -> Vec<String> {
    let _ = black_box(x);
    let mut frames = [0usize; 32];
    let n = ustrace_inspect::stack::capture(0, &mut frames);
    let inv = ustrace_inspect::symbols::inventory();
    frames[..n]
        .iter()
        .map(|&a| inv.format_sym_off(a.saturating_sub(1)))
        .collect()
}

#[no_mangle]
#[inline(never)]
pub fn uw_cap_outer(x: u64) -> Vec<String> {
    let s = uw_cap_inner(black_box(x));
    black_box(s)
}

fn counting(names: &[&str]) -> (Fprobe, Arc<AtomicU64>, Arc<AtomicU64>) {
    let entries = Arc::new(AtomicU64::new(0));
    let exits = Arc::new(AtomicU64::new(0));
    let (n, x) = (entries.clone(), exits.clone());
    let fp = Fprobe::builder()
        .entry_handler(move |_, _, _, _, _| {
            n.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .exit_handler(move |_, _, _, _, _| {
            x.fetch_add(1, Ordering::Relaxed);
        })
        .register_syms(names)
        .expect("register");
    (fp, entries, exits)
}

#[test]
fn unwinder_entry_points_are_hooked() {
    let _g = serial();
    let (fp, _, _) = counting(&["uw_panicker"]);
    let status = ustrace_fprobe::unwind_hook_status();
    assert!(
        status
            .iter()
            .any(|(n, _, e)| n.starts_with("_Unwind_RaiseException") && e.is_none()),
        "{status:?}"
    );
    drop(fp);
}

#[test]
fn panic_unwinds_through_probed_functions() {
    let _g = serial();
    let (fp, entries, exits) = counting(&["uw_panicker", "uw_outer"]);
    assert_eq!(uw_outer(1), 3);
    assert_eq!(
        (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed)
        ),
        (2, 2)
    );
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(|| uw_outer(13));
    std::panic::set_hook(prev);
    assert!(r.is_err(), "the panic must propagate to catch_unwind");
    // Both frames were abandoned by the unwind: entries counted, no exit, misses recorded.
    assert_eq!(
        (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed)
        ),
        (4, 2)
    );
    assert!(fp.nmissed() >= 2, "nmissed {}", fp.nmissed());
    assert_eq!(ustrace_fprobe::outstanding_frames(), 0);
    // Probing keeps working afterwards, entries and exits pair again.
    for i in 0..10 {
        assert_eq!(uw_outer(i), i * 2 + 1);
    }
    assert_eq!(
        (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed)
        ),
        (24, 22)
    );
}

#[test]
fn panic_through_a_probed_c_frame() {
    let _g = serial();
    let Some(lib) = common::c_lib() else { return };
    // SAFETY: signature matches tests/c/probed.c; the C code has unwind tables (-g, default
    // asynchronous unwind tables on x86_64).
    let call_back: extern "C-unwind" fn(extern "C-unwind" fn(u64) -> u64, u64) -> u64 =
        unsafe { std::mem::transmute(lib.sym("c_call_back")) };
    let (fp, entries, exits) = counting(&["c_call_back", "uw_panicker"]);
    assert_eq!(call_back(uw_panicker, 4), 9);
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(|| call_back(uw_panicker, 13));
    std::panic::set_hook(prev);
    assert!(r.is_err());
    assert_eq!(call_back(uw_panicker, 5), 11);
    assert_eq!(
        (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed)
        ),
        (6, 4)
    );
    drop(fp);
}

#[test]
fn backtrace_inside_a_probed_function_shows_real_callers() {
    let _g = serial();
    let (fp, _, _) = counting(&["uw_bt_inner", "uw_bt_outer"]);
    let bt = uw_bt_outer(1);
    drop(fp);
    assert!(bt.contains("uw_bt_inner"), "{bt}");
    assert!(bt.contains("uw_bt_outer"), "{bt}");
    assert!(
        bt.contains("backtrace_inside_a_probed_function_shows_real_callers"),
        "{bt}"
    );
}

#[test]
fn stack_capture_inside_probed_functions_keeps_their_exits() {
    let _g = serial();
    let (fp, entries, exits) = counting(&["uw_cap_inner", "uw_cap_outer"]);
    let missed_before = fp.nmissed();
    let mut stacks = Vec::new();
    for i in 0..3 {
        stacks.push(uw_cap_outer(i));
    }
    let missed = fp.nmissed() - missed_before;
    drop(fp);
    for stack in &stacks {
        let at = |name: &str| stack.iter().position(|f| f.starts_with(name));
        // The walk saw the real callers, in order, through both hooked returns.
        let (inner, outer, test) = (
            at("uw_cap_inner"),
            at("uw_cap_outer"),
            at("unwind::stack_capture_inside_probed_functions_keeps_their_exits"),
        );
        assert!(
            inner.is_some() && inner < outer && outer < test,
            "{stack:#?}"
        );
    }
    // ...and both frames still returned through their exit handlers.
    assert_eq!(entries.load(Ordering::Relaxed), 6);
    assert_eq!(exits.load(Ordering::Relaxed), 6, "missed {missed}");
    assert_eq!(missed, 0);
}

#[test]
fn cxx_exception_through_probed_frames() {
    let _g = serial();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/cxx.cpp");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fprobe-cxx-{}.so", std::process::id()));
    let built = std::process::Command::new("c++")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .status();
    if !matches!(built, Ok(s) if s.success()) {
        eprintln!("skipped: no C++ compiler ({built:?})");
        return;
    }
    let c = std::ffi::CString::new(out.to_str().unwrap()).unwrap();
    // SAFETY: loading the library we just built.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null());
    // SAFETY: symbol of the library just loaded; signature matches cxx.cpp.
    let catcher: extern "C" fn(i32) -> i32 =
        unsafe { std::mem::transmute(libc::dlsym(h, c"cxx_catcher".as_ptr())) };
    let (fp, entries, exits) = counting(&["cxx_thrower", "cxx_middle", "cxx_catcher"]);
    assert_eq!(catcher(4), 9);
    assert_eq!(
        (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed)
        ),
        (3, 3)
    );
    assert_eq!(catcher(13), -1, "the exception must reach the catch block");
    // The throw detached all three hooked frames, including the catcher that survived it.
    assert_eq!(
        (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed)
        ),
        (6, 3)
    );
    assert_eq!(fp.nmissed(), 3);
    assert_eq!(catcher(5), 11);
    assert_eq!(
        (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed)
        ),
        (9, 6)
    );
    drop(fp);
    // The library stays loaded for the rest of the process; only its file goes.
    let _ = std::fs::remove_file(&out);
}
