//! End-to-end fprobe behaviour on Rust and C functions.

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ustrace_fprobe::{EntryAction, Fprobe};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn ut_rust_work(x: u64, y: u64) -> u64 {
    let mut v = black_box(x);
    for i in 0..black_box(3) {
        v = v.wrapping_mul(31).rotate_left(7) ^ (y + i);
    }
    v
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn ut_rust_float(x: f64, y: f64) -> f64 {
    black_box(x) * black_box(y) + 0.5
}

#[test]
fn entry_and_exit_see_args_return_and_entry_data() {
    let _g = serial();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s1, s2) = (seen.clone(), seen.clone());
    let fp = Fprobe::builder()
        .entry_data_size(16)
        .entry_handler(move |_fp, ip, ret, regs, data| {
            data[..8].copy_from_slice(&regs.arg(0).unwrap().to_le_bytes());
            data[8..16].copy_from_slice(&regs.arg(1).unwrap().to_le_bytes());
            s1.lock()
                .unwrap()
                .push(("entry", ip, ret, regs.arg(0).unwrap(), 0));
            EntryAction::Continue
        })
        .exit_handler(move |_fp, ip, ret, regs, data| {
            let a = u64::from_le_bytes(data[..8].try_into().unwrap());
            s2.lock()
                .unwrap()
                .push(("exit", ip, ret, a, regs.return_value()));
        })
        .register_syms(&["ut_rust_work"])
        .expect("register");
    let expect = {
        let mut v = 5u64;
        for i in 0..3 {
            v = v.wrapping_mul(31).rotate_left(7) ^ (9 + i);
        }
        v
    };
    assert_eq!(ut_rust_work(5, 9), expect);
    fp.unregister().unwrap();
    assert_eq!(ut_rust_work(5, 9), expect);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let f = ut_rust_work as *const () as usize;
    assert_eq!(seen[0].0, "entry");
    assert_eq!(seen[0].1, f);
    assert_eq!(seen[0].3, 5);
    assert_eq!(seen[1], ("exit", f, seen[0].2, 5, expect));
}

#[test]
fn float_arguments_survive_the_trampoline() {
    let _g = serial();
    let got = Arc::new(Mutex::new(None));
    let g2 = got.clone();
    let fp = Fprobe::builder()
        .entry_handler(move |_, _, _, regs, _| {
            *g2.lock().unwrap() = Some((regs.float_arg(0).unwrap(), regs.float_arg(1).unwrap()));
            // Clobber SSE state in the handler: the trampoline must restore it.
            let z = black_box(1.0f64) / black_box(3.0f64);
            black_box(z);
            EntryAction::Continue
        })
        .register_syms(&["ut_rust_float"])
        .unwrap();
    assert_eq!(ut_rust_float(1.5, 4.0), 6.5);
    assert_eq!(*got.lock().unwrap(), Some((1.5, 4.0)));
    drop(fp);
}

#[test]
fn c_library_functions_by_filter_and_several_fprobes_share_a_site() {
    let _g = serial();
    let Some(lib) = common::c_lib() else { return };
    // SAFETY: signatures match tests/c/probed.c.
    let c_add: extern "C" fn(u64, u64) -> u64 = unsafe { std::mem::transmute(lib.sym("c_add")) };
    // SAFETY: signature matches tests/c/probed.c.
    let c_mix: extern "C" fn(u64, u64, u64, u64, u64, u64, u64, u64) -> u64 =
        unsafe { std::mem::transmute(lib.sym("c_mix")) };
    // SAFETY: signature matches tests/c/probed.c.
    let c_scale: extern "C" fn(f64, f64, u64) -> f64 =
        unsafe { std::mem::transmute(lib.sym("c_scale")) };
    let hits_a = Arc::new(AtomicU64::new(0));
    let exits_a = Arc::new(AtomicU64::new(0));
    let (h, e) = (hits_a.clone(), exits_a.clone());
    let a = Fprobe::builder()
        .entry_handler(move |_, _, _, _, _| {
            h.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .exit_handler(move |_, _, _, _, _| {
            e.fetch_add(1, Ordering::Relaxed);
        })
        .register("c_add c_mix c_scale", None)
        .unwrap();
    assert_eq!(a.functions().len(), 3);
    let stack8 = Arc::new(AtomicU64::new(0));
    let s8 = stack8.clone();
    let b = Fprobe::builder()
        .entry_handler(move |_, _, _, regs, _| {
            if let Some(v) = regs.arg(7) {
                s8.store(v, Ordering::Relaxed);
            }
            EntryAction::Continue
        })
        .register(
            "c_*",
            Some("c_add c_scale c_fib c_jump* c_longjmp* c_exit* c_call* c_tiny c_loop* c_early* c_spawn* c_thread*"),
        )
        .unwrap();
    assert_eq!(
        b.functions(),
        vec![lib.sym("c_mix")],
        "refused: {:?}",
        b.refused()
    );
    let text = ustrace_fprobe::enabled_functions();
    assert!(text.lines().any(|l| l.starts_with("c_mix (2) R")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("c_add (1) R")), "{text}");
    assert_eq!(c_add(2, 3), 5);
    assert_eq!(
        c_mix(1, 1, 1, 1, 1, 1, 1, 100),
        1 + 2 + 3 + 4 + 5 + 6 + 7 + 800
    );
    assert_eq!(c_scale(2.0, 3.5, 4), 11.0);
    assert_eq!(
        stack8.load(Ordering::Relaxed),
        100,
        "8th argument read from the stack"
    );
    assert_eq!(hits_a.load(Ordering::Relaxed), 3);
    assert_eq!(exits_a.load(Ordering::Relaxed), 3);
    drop(b);
    let text = ustrace_fprobe::enabled_functions();
    assert!(text.lines().any(|l| l.starts_with("c_mix (1) R")), "{text}");
    a.unregister().unwrap();
    assert!(!ustrace_fprobe::enabled_functions().contains("c_add"));
    assert_eq!(c_add(2, 3), 5);
    assert_eq!(hits_a.load(Ordering::Relaxed), 3);
}

#[test]
fn skip_exit_disable_enable() {
    let _g = serial();
    let exits = Arc::new(AtomicUsize::new(0));
    let entries = Arc::new(AtomicUsize::new(0));
    let (x, n) = (exits.clone(), entries.clone());
    let fp = Fprobe::builder()
        .entry_handler(move |_, _, _, regs, _| {
            n.fetch_add(1, Ordering::Relaxed);
            if regs.arg(0) == Some(1) {
                EntryAction::SkipExit
            } else {
                EntryAction::Continue
            }
        })
        .exit_handler(move |_, _, _, _, _| {
            x.fetch_add(1, Ordering::Relaxed);
        })
        .register_ips(&[ut_rust_work as *const () as usize])
        .unwrap();
    ut_rust_work(1, 0);
    ut_rust_work(2, 0);
    assert_eq!(
        (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed)
        ),
        (2, 1)
    );
    fp.disable();
    assert!(fp.is_disabled());
    ut_rust_work(2, 0);
    assert_eq!(
        (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed)
        ),
        (2, 1)
    );
    fp.enable();
    ut_rust_work(2, 0);
    assert_eq!(
        (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed)
        ),
        (3, 2)
    );
}

#[test]
fn libc_function_by_plain_name_despite_symbol_versions() {
    let _g = serial();
    let text = std::ffi::CString::new("12345").unwrap();
    let ptr = text.as_ptr() as u64;
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    let fp = match Fprobe::builder()
        .entry_handler(move |_, _, _, regs, _| {
            if regs.arg(0) == Some(ptr) {
                s.fetch_add(1, Ordering::Relaxed);
            }
            EntryAction::Continue
        })
        .register_syms(&["strtol"])
    {
        Ok(fp) => fp,
        Err(ustrace_fprobe::Error::Refused(why)) => {
            eprintln!("skipped: this libc's strtol cannot be probed: {why}");
            return;
        }
        Err(e) => panic!("strtol not found by its plain name: {e}"),
    };
    // SAFETY: valid NUL-terminated string, null end pointer allowed.
    let v = unsafe { libc::strtol(text.as_ptr(), std::ptr::null_mut(), 10) };
    drop(fp);
    assert_eq!(v, 12345);
    assert_eq!(seen.load(Ordering::Relaxed), 1);
}

/// IFUNC functions (strlen picks an implementation at load time) are probed at the
/// implementation the inventory lists, not refused.
#[test]
fn ifunc_functions_are_probed_at_their_implementation() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let fp = match ustrace_fprobe::Fprobe::builder()
        .entry_handler(move |_, _, _, _, _| {
            h.fetch_add(1, Ordering::Relaxed);
            ustrace_fprobe::EntryAction::Continue
        })
        .register_syms(&["strlen"])
    {
        Ok(fp) => fp,
        Err(e) => panic!("strlen (an IFUNC) was refused: {e}"),
    };
    let text = std::ffi::CString::new("twelve bytes").unwrap();
    // SAFETY: a valid NUL-terminated string.
    let n = unsafe { libc::strlen(std::hint::black_box(text.as_ptr())) };
    assert_eq!(n, 12);
    assert!(hits.load(Ordering::Relaxed) >= 1);
    fp.unregister().unwrap();
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn ut_rust_panicky(x: u64) -> u64 {
    black_box(x).wrapping_mul(3) + 1
}

/// A handler that panics stops there: the probed call returns its value, the panic goes no
/// further, and the next hits on the same thread run the handlers again (the thread was left
/// outside the dispatcher). Entry-only (the lone-fprobe fast path) and entry + exit.
#[test]
fn panicking_handlers_are_contained() {
    let _g = serial();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {})); // the panics below are expected
    for with_exit in [false, true] {
        let entries = Arc::new(AtomicUsize::new(0));
        let exits = Arc::new(AtomicUsize::new(0));
        let (e, x) = (entries.clone(), exits.clone());
        let mut b = Fprobe::builder().entry_handler(move |_, _, _, regs, _| {
            let n = e.fetch_add(1, Ordering::SeqCst);
            if n % 2 == 0 && regs.arg(0) == Some(7) {
                panic!("entry handler panics on purpose");
            }
            EntryAction::Continue
        });
        if with_exit {
            b = b.exit_handler(move |_, _, _, _, _| {
                if x.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
                    panic!("exit handler panics on purpose");
                }
            });
        }
        let fp = b.register_syms(&["ut_rust_panicky"]).expect("register");
        for i in 0..4u64 {
            assert_eq!(ut_rust_panicky(black_box(7)), 22, "call {i}");
        }
        assert_eq!(entries.load(Ordering::SeqCst), 4, "with_exit {with_exit}");
        assert_eq!(
            exits.load(Ordering::SeqCst),
            if with_exit { 4 } else { 0 },
            "with_exit {with_exit}"
        );
        assert_eq!(fp.nmissed(), 0, "with_exit {with_exit}");
        assert_eq!(ustrace_fprobe::outstanding_frames(), 0);
        fp.unregister().expect("unregister");
    }
    std::panic::set_hook(hook);
}
