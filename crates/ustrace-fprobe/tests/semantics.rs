//! fprobe.rst guarantees and the hard cases: recursion, longjmp, thread exit, fork, refusal.

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ustrace_fprobe::{EntryAction, Error, Fprobe};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn sm_helper(x: u64) -> u64 {
    black_box(x).wrapping_mul(17) ^ 3
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn sm_fact(n: u64) -> u64 {
    if black_box(n) <= 1 {
        return 1;
    }
    n * sm_fact(n - 1)
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn sm_fork_in_probe(tag: u64) -> i32 {
    let _ = black_box(tag);
    // SAFETY: fork; the child only runs probed functions and _exit.
    unsafe { libc::fork() }
}

/// Tail-calls `sm_helper`: its return slot is the caller's, so when both are probed with exit
/// handlers, `sm_helper` enters with a slot that already holds the return trampoline.
#[no_mangle]
#[unsafe(naked)]
pub extern "C" fn sm_tail_to_helper(x: u64) -> u64 {
    // Five bytes of movable prologue (push, mov, pop), then the tail call.
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "pop rbp",
        "jmp {helper}",
        helper = sym sm_helper,
    )
}

/// Tail-calls `sm_tail_to_helper`: three hooked functions share one return slot.
#[no_mangle]
#[unsafe(naked)]
pub extern "C" fn sm_tail_to_tail(x: u64) -> u64 {
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "pop rbp",
        "jmp {next}",
        next = sym sm_tail_to_helper,
    )
}

struct Counts {
    entries: Arc<AtomicU64>,
    exits: Arc<AtomicU64>,
}

fn counting_builder() -> (ustrace_fprobe::FprobeBuilder, Counts) {
    let entries = Arc::new(AtomicU64::new(0));
    let exits = Arc::new(AtomicU64::new(0));
    let (n, x) = (entries.clone(), exits.clone());
    let b = Fprobe::builder()
        .entry_handler(move |_, _, _, _, _| {
            n.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .exit_handler(move |_, _, _, _, _| {
            x.fetch_add(1, Ordering::Relaxed);
        });
    (b, Counts { entries, exits })
}

impl Counts {
    fn get(&self) -> (u64, u64) {
        (
            self.entries.load(Ordering::Relaxed),
            self.exits.load(Ordering::Relaxed),
        )
    }
}

#[test]
fn recursion_pairs_each_exit_with_its_entry() {
    let _g = serial();
    let depth_log = Arc::new(Mutex::new(Vec::new()));
    let (l1, l2) = (depth_log.clone(), depth_log.clone());
    let fp = Fprobe::builder()
        .entry_data_size(8)
        .entry_handler(move |_, _, _, regs, data| {
            let n = regs.arg(0).unwrap();
            data.copy_from_slice(&n.to_le_bytes());
            l1.lock().unwrap().push(('>', n));
            EntryAction::Continue
        })
        .exit_handler(move |_, _, _, regs, data| {
            let n = u64::from_le_bytes(data.try_into().unwrap());
            // The exit of sm_fact(n) returns n!.
            assert_eq!(regs.return_value(), (1..=n.max(1)).product::<u64>());
            l2.lock().unwrap().push(('<', n));
        })
        .register_syms(&["sm_fact"])
        .unwrap();
    assert_eq!(sm_fact(6), 720);
    drop(fp);
    let log = depth_log.lock().unwrap();
    let want: Vec<(char, u64)> = (1..=6)
        .rev()
        .map(|n| ('>', n))
        .chain((1..=6).map(|n| ('<', n)))
        .collect();
    assert_eq!(*log, want);
}

/// The entry trampoline enters a hooked function with a `call` when the dispatcher hooked its
/// return; a tail-called function finds the return slot set already by its caller's hook.
/// Every exit must run, innermost first, each with the real return value, and the caller
/// must get it too. Chains of two and of three functions sharing one slot.
#[test]
fn tail_calls_between_hooked_functions_run_every_exit() {
    let _g = serial();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (l1, l2) = (log.clone(), log.clone());
    let fp = Fprobe::builder()
        .entry_handler(move |_, ip, ret, _, _| {
            l1.lock().unwrap().push(("entry", ip, ret, 0));
            EntryAction::Continue
        })
        .exit_handler(move |_, ip, ret, regs, _| {
            l2.lock()
                .unwrap()
                .push(("exit", ip, ret, regs.return_value()));
        })
        .register_syms(&["sm_tail_to_tail", "sm_tail_to_helper", "sm_helper"])
        .expect("register");
    let expect = (black_box(5u64).wrapping_mul(17)) ^ 3;
    for _ in 0..3 {
        assert_eq!(sm_tail_to_helper(black_box(5)), expect);
        assert_eq!(sm_tail_to_tail(black_box(5)), expect);
    }
    assert_eq!(ustrace_fprobe::outstanding_frames(), 0);
    fp.unregister().unwrap();
    let [two, three, one] = [
        sm_tail_to_helper as *const () as usize,
        sm_tail_to_tail as *const () as usize,
        sm_helper as *const () as usize,
    ];
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 3 * (4 + 6), "{log:?}");
    let mut at = 0;
    for _ in 0..3 {
        for chain in [&[two, one][..], &[three, two, one][..]] {
            let round = &log[at..at + 2 * chain.len()];
            at += 2 * chain.len();
            // Every handler is told the real caller (where the chain returns), never the
            // trampoline a tail-called function found in the slot.
            let caller = round[0].2;
            assert_ne!(caller, 0);
            let want: Vec<_> = chain
                .iter()
                .map(|&f| ("entry", f, caller, 0))
                .chain(chain.iter().rev().map(|&f| ("exit", f, caller, expect)))
                .collect();
            assert_eq!(round, &want[..], "{log:?}");
        }
    }
}

#[test]
fn probed_function_called_from_a_handler_does_not_recurse() {
    let _g = serial();
    let (b, counts) = counting_builder();
    let helper_fp = b.register_syms(&["sm_helper"]).unwrap();
    let outer = Fprobe::builder()
        .entry_handler(|_, _, _, _, _| {
            // sm_helper is probed: calling it here must not run helper_fp's handlers.
            black_box(sm_helper(1));
            EntryAction::Continue
        })
        .register_syms(&["sm_fact"])
        .unwrap();
    assert_eq!(sm_fact(3), 6);
    assert_eq!(counts.get(), (0, 0));
    assert_eq!(helper_fp.nmissed(), 3, "one miss per recursive hit");
    assert_eq!(sm_helper(2), (2u64 * 17) ^ 3);
    assert_eq!(counts.get(), (1, 1));
    drop(outer);
}

#[test]
fn longjmp_past_probed_frames() {
    let _g = serial();
    let Some(lib) = common::c_lib() else { return };
    // SAFETY: signature matches tests/c/probed.c.
    let driver: extern "C" fn(u64) -> u64 =
        unsafe { std::mem::transmute(lib.sym("c_longjmp_driver")) };
    let (b, counts) = counting_builder();
    let fp = b
        .register_syms(&["c_longjmp_driver", "c_jump_deep", "c_add"])
        .unwrap();
    for round in 0..3 {
        // c_jump_deep recurses 6 deep then longjmps back into the driver, which calls c_add.
        assert_eq!(driver(5), 7000 + 6);
        assert_eq!(ustrace_fprobe::outstanding_frames(), 0);
        let r = round + 1;
        // entries: driver + 6 c_jump_deep + c_add; exits: driver + c_add.
        assert_eq!(counts.get(), (8 * r, 2 * r));
        assert_eq!(fp.nmissed(), 6 * r, "abandoned frames count as missed");
    }
}

/// The entry-only hit path skips the shadow-stack bookkeeping only when no frame is stale: a
/// hit whose return slot lies above frames a longjmp abandoned must still drop them.
#[test]
fn entry_only_hit_after_longjmp_drops_abandoned_frames() {
    let _g = serial();
    let Some(lib) = common::c_lib() else { return };
    // SAFETY: signature matches tests/c/probed.c.
    let driver: extern "C" fn(u64) -> u64 =
        unsafe { std::mem::transmute(lib.sym("c_longjmp_driver")) };
    let (b, counts) = counting_builder();
    let deep = b.register_syms(&["c_jump_deep"]).unwrap();
    let adds = Arc::new(AtomicU64::new(0));
    let a = adds.clone();
    let add = Fprobe::builder()
        .entry_handler(move |_, _, _, _, _| {
            a.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .register_syms(&["c_add"])
        .unwrap();
    for round in 1..=3 {
        // c_jump_deep recurses 6 deep and longjmps back; then the driver calls c_add, whose
        // entry is the thread's next probe event.
        assert_eq!(driver(5), 7000 + 6);
        assert_eq!(ustrace_fprobe::outstanding_frames(), 0);
        assert_eq!(counts.get(), (6 * round, 0));
        assert_eq!(
            deep.nmissed(),
            6 * round,
            "abandoned frames count as missed"
        );
        assert_eq!(adds.load(Ordering::Relaxed), round);
    }
    drop(add);
    drop(deep);
}

#[test]
fn thread_exit_with_probed_frames_outstanding() {
    let _g = serial();
    let Some(lib) = common::c_lib() else { return };
    // SAFETY: signature matches tests/c/probed.c.
    let spawn: extern "C" fn() -> u64 =
        unsafe { std::mem::transmute(lib.sym("c_spawn_exiting_thread")) };
    let (b, counts) = counting_builder();
    let fp = b.register_syms(&["c_exit_thread"]).unwrap();
    for _ in 0..3 {
        assert_eq!(spawn(), 42, "pthread_exit value");
    }
    assert_eq!(counts.get(), (12, 0));
    // The process and probing keep working.
    std::thread::spawn(|| assert_eq!(sm_fact(4), 24))
        .join()
        .unwrap();
    drop(fp);
}

#[test]
fn fork_inside_a_probed_function() {
    let _g = serial();
    let (b, counts) = counting_builder();
    let fp = b.register_syms(&["sm_fork_in_probe", "sm_helper"]).unwrap();
    let pid = sm_fork_in_probe(1);
    if pid == 0 {
        // Child: returned through the hooked return (exit handler ran here), probes still work,
        // and registration works in the single-threaded child.
        let ok_exit = counts.get() == (1, 1);
        let before = counts.get();
        let ok_call = sm_helper(5) == (5 * 17) ^ 3 && counts.get() == (before.0 + 1, before.1 + 1);
        let ok_reg = Fprobe::builder()
            .entry_handler(|_, _, _, _, _| EntryAction::Continue)
            .register_syms(&["sm_fact"])
            .and_then(|f| f.unregister())
            .is_ok();
        let code = if ok_exit && ok_call && ok_reg {
            0
        } else {
            1 + ok_exit as i32 * 2 + ok_call as i32 * 4
        };
        // SAFETY: leave the child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child died: {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child checks failed");
    assert_eq!(counts.get(), (1, 1));
    drop(fp);
}

#[test]
fn unpatchable_functions_are_refused_with_a_reason() {
    let _g = serial();
    let Some(lib) = common::c_lib() else { return };
    for (name, why) in [
        ("c_tiny", "too short"),
        ("c_loop_head", "branch target inside"),
        ("c_early_branch", "control flow"),
    ] {
        let reason = ustrace_fprobe::check_patchable(lib.sym(name))
            .unwrap_or_else(|| panic!("{name} accepted"));
        assert!(reason.contains(why), "{name}: {reason}");
        let err = Fprobe::builder()
            .entry_handler(|_, _, _, _, _| EntryAction::Continue)
            .register_syms(&[name])
            .unwrap_err();
        assert!(
            matches!(&err, Error::Refused(r) if r.contains(why)),
            "{name}: {err}"
        );
        let mut bytes = [0u8; 2];
        // SAFETY: reading the first bytes of a mapped function.
        unsafe { std::ptr::copy_nonoverlapping(lib.sym(name) as *const u8, bytes.as_mut_ptr(), 2) };
        assert_ne!(bytes[0], 0xe9, "{name} must stay unpatched");
        assert_ne!(bytes[0], 0xcc, "{name} must stay unpatched");
    }
    // A filter skips refused functions and lists them.
    let fp = Fprobe::builder()
        .entry_handler(|_, _, _, _, _| EntryAction::Continue)
        .register("c_tiny c_add", None)
        .unwrap();
    assert_eq!(fp.functions(), vec![lib.sym("c_add")]);
    assert!(fp.refused().iter().any(|r| r.function == "c_tiny"));
    assert!(ustrace_fprobe::check_patchable(lib.sym("c_add")).is_none());
}

// The loader jumps to a program's entry point (`_start`) with no return address and the
// stack aligned as no call leaves it: probed, the entry handler ran on a misaligned stack
// and a return hook would overwrite argc. It is refused by its address and by its name.
#[test]
fn the_programs_entry_point_is_refused() {
    let _g = serial();
    // SAFETY: getauxval only reads the auxiliary vector.
    let entry = unsafe { libc::getauxval(libc::AT_ENTRY) } as usize;
    assert_ne!(entry, 0);
    let by_address = Fprobe::builder()
        .entry_handler(|_, _, _, _, _| EntryAction::Continue)
        .register_ips(&[entry])
        .unwrap_err();
    assert!(
        matches!(&by_address, Error::Refused(r) if r.contains("entry point")),
        "{by_address}"
    );
    let by_name = Fprobe::builder()
        .entry_handler(|_, _, _, _, _| EntryAction::Continue)
        .register_syms(&["_start"])
        .unwrap_err();
    assert!(
        matches!(&by_name, Error::Refused(r) if r.contains("entry point")),
        "{by_name}"
    );
}

#[test]
fn nr_maxactive_bounds_pending_exits() {
    let _g = serial();
    let (b, counts) = counting_builder();
    let fp = b.nr_maxactive(2).register_syms(&["sm_fact"]).unwrap();
    assert_eq!(sm_fact(5), 120);
    // 5 nested calls, only 2 may have a pending exit.
    assert_eq!(counts.get(), (5, 2));
    assert_eq!(fp.nmissed(), 3);
}

#[test]
fn no_filter_match_is_an_error() {
    let err = Fprobe::builder()
        .entry_handler(|_, _, _, _, _| EntryAction::Continue)
        .register("no_such_function_anywhere_*", None)
        .unwrap_err();
    assert!(matches!(err, Error::NoMatch(_)), "{err}");
}
