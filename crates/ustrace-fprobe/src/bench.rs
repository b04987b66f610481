//! The floors under an fprobe hit, for `ustrace bench` (`fprobe_trampoline_floor`,
//! `fprobe_trampoline_floor_exit`).
//!
//! [`trampoline_floor_call`] is a function like the one the fprobe figures probe, patched
//! (once, by [`prepare_trampoline_floor`]) exactly as a probed function is: a `jmp` to an
//! entry stub (`push r11; mov r11, &Site; jmp`), the entry trampoline's code saving every
//! general-purpose register and `xmm0`-`xmm15`, a call, the restore, `jmp [r11]` to the
//! relocated prologue (which pops the caller's `r11`) and its jump back into the body. Only
//! the call differs: an empty `extern "C"` function instead of the dispatcher (the
//! trampolines are expanded from one macro, so the floor follows every change to the real
//! one). The time it adds to a plain call is what any sound user-space entry probe pays with
//! this register frame before doing any work; the dispatcher and the handler come on top.
//!
//! [`trampoline_floor_exit_call`] is the same for a probe on both entry and return: its
//! entry trampoline calls a function that only keeps the return address on a per-thread
//! stack and writes the return trampoline over it, and the return trampoline (expanded from
//! the real one's macro, saving the same registers) calls one that only puts it back. That
//! is the least any return probe with this frame does; the shadow stack's bookkeeping, the
//! quiescence counter and the handlers come on top.
//!
//! Not part of the API: hidden from the docs, kept stable only for the bench.

use std::hint::black_box;
use std::sync::OnceLock;

use crate::Error;

/// The floor's target: the body of the bench's probed function (`a * 31 ^ b`), named
/// `ustrace_fprobe_*` so that no fprobe can ever claim it (the machinery is `notrace`).
/// Call [`prepare_trampoline_floor`] first; before that it is a plain call.
#[export_name = "ustrace_fprobe_trampoline_floor_call"]
#[inline(never)]
pub extern "C" fn trampoline_floor_call(a: u64, b: u64) -> u64 {
    black_box(a.wrapping_mul(31) ^ b)
}

/// The entry-and-return floor's target: the body of [`trampoline_floor_call`] with another
/// factor (`a * 37 ^ b`; the same body would be merged into one function by the optimiser).
/// Call [`prepare_trampoline_floor_exit`] first; before that it is a plain call.
#[export_name = "ustrace_fprobe_trampoline_floor_exit_call"]
#[inline(never)]
pub extern "C" fn trampoline_floor_exit_call(a: u64, b: u64) -> u64 {
    black_box(a.wrapping_mul(37) ^ b)
}

/// Patches [`trampoline_floor_call`] to go through the floor trampoline (the first call does
/// it; later ones return the first one's result). Once this returned `Ok`, every call of it
/// runs the floor trampoline.
pub fn prepare_trampoline_floor() -> Result<(), Error> {
    static DONE: OnceLock<Result<usize, Error>> = OnceLock::new();
    attach_floor_once(&DONE, trampoline_floor_call, false)
}

/// Patches [`trampoline_floor_exit_call`] to go through the entry-and-return floor
/// trampolines, as [`prepare_trampoline_floor`] does for the entry floor.
pub fn prepare_trampoline_floor_exit() -> Result<(), Error> {
    static DONE: OnceLock<Result<usize, Error>> = OnceLock::new();
    attach_floor_once(&DONE, trampoline_floor_exit_call, true)
}

/// Patches `target` for good the first time, keeping that outcome in `done` for every call.
fn attach_floor_once(
    done: &OnceLock<Result<usize, Error>>,
    target: extern "C" fn(u64, u64) -> u64,
    hook_return: bool,
) -> Result<(), Error> {
    done.get_or_init(|| {
        let f = target as usize;
        let size = ustrace_inspect::symbols::inventory()
            .lookup(f)
            .filter(|(_, off)| *off == 0)
            .map(|(s, _)| s.size)
            .filter(|&n| n > 0);
        crate::arch::attach_floor(f, size, hook_return)
    })
    .as_ref()
    .map(|_| ())
    .map_err(Clone::clone)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Every integer and float argument register feeds the result, each with its own weight:
    /// a register the trampoline restored wrongly (or swapped with another) changes it.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn floor_args(a: u64, b: u64, c: u64, d: u64, e: u64, f: u64, x: [f64; 8], g: u64) -> f64 {
        let ints = black_box(a)
            .wrapping_mul(3)
            .wrapping_add(b.wrapping_mul(5))
            .wrapping_add(c.wrapping_mul(7))
            .wrapping_add(d.wrapping_mul(11))
            .wrapping_add(e.wrapping_mul(13))
            .wrapping_add(f.wrapping_mul(17))
            .wrapping_add(g.wrapping_mul(19));
        let floats = x[0] * 2.0
            + x[1] * 3.0
            + x[2] * 5.0
            + x[3] * 7.0
            + x[4] * 11.0
            + x[5] * 13.0
            + x[6] * 17.0
            + x[7] * 19.0;
        ints as f64 + floats
    }

    /// `floor_args` (plus `PLUS`) with its floats spread over xmm0-xmm7 one by one (an array
    /// would go by memory). Each floor test patches its own instance (a site is patched once).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    extern "C" fn floor_xmm<const PLUS: u32>(
        a: u64,
        b: u64,
        c: u64,
        d: u64,
        e: u64,
        f: u64,
        x0: f64,
        x1: f64,
        x2: f64,
        x3: f64,
        x4: f64,
        x5: f64,
        x6: f64,
        x7: f64,
        g: u64,
    ) -> f64 {
        floor_args(a, b, c, d, e, f, [x0, x1, x2, x3, x4, x5, x6, x7], g) + PLUS as f64
    }

    /// Patches `floor_xmm::<PLUS>` to go through a floor trampoline and checks that every call
    /// gives what `floor_args` plus `PLUS` gives.
    fn check_every_argument_register<const PLUS: u32>(hook_return: bool) {
        let f = floor_xmm::<PLUS> as *const () as usize;
        let at = match crate::arch::attach_floor(f, None, hook_return) {
            Ok(at) => at,
            Err(e) => {
                println!("skipped: cannot patch here: {e}");
                return;
            }
        };
        assert!(is_patched(at), "the floor site was not patched");
        for i in 0..1000u64 {
            let xs = [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5].map(|x: f64| x + i as f64);
            let want = floor_args(1 + i, 2 + i, 3, 4, 5, 6 * i, xs, 8 + i) + PLUS as f64;
            let got = floor_xmm::<PLUS>(
                1 + i,
                2 + i,
                3,
                4,
                5,
                6 * i,
                xs[0],
                xs[1],
                xs[2],
                xs[3],
                xs[4],
                xs[5],
                xs[6],
                xs[7],
                8 + i,
            );
            assert_eq!(got.to_bits(), want.to_bits(), "call {i}");
        }
    }

    /// Whether the 5 bytes at `at` are a `jmp rel32` (the patch).
    fn is_patched(at: usize) -> bool {
        let mut b = [0u8; 1];
        crate::arch::read_text(at, &mut b).is_ok() && b[0] == 0xe9
    }

    #[test]
    fn the_floor_trampoline_returns_the_value_and_keeps_every_argument_register() {
        check_every_argument_register::<0>(false);
    }

    /// Prepares a bench target, then checks that it is patched and computes `a * factor ^ b`.
    fn check_bench_target(
        prepare: fn() -> Result<(), Error>,
        target: extern "C" fn(u64, u64) -> u64,
        factor: u64,
    ) {
        if let Err(e) = prepare() {
            println!("skipped: cannot patch here: {e}");
            return;
        }
        let f = target as usize;
        let at = ustrace_inspect::symbols::inventory()
            .lookup(f)
            .map(|(s, _)| s.addr)
            .unwrap_or(f);
        assert!(is_patched(at) || is_patched(at + 4), "not patched");
        for i in 0..1000u64 {
            assert_eq!(target(black_box(i), 7), i.wrapping_mul(factor) ^ 7);
        }
        // Preparing again is a no-op that reports the same success.
        prepare().unwrap();
    }

    #[test]
    fn the_floor_call_computes_its_body_through_the_trampoline() {
        check_bench_target(prepare_trampoline_floor, trampoline_floor_call, 31);
    }

    /// Recursive, so that hooked returns nest (deeper than the floor's stack of return
    /// addresses at 40: the deepest calls run unhooked).
    #[inline(never)]
    #[export_name = "ustrace_fprobe_floor_test_nest"]
    extern "C" fn nest(depth: u64) -> u64 {
        // First, so that the optimised prologue is not the branch (which cannot be moved).
        let again: extern "C" fn(u64) -> u64 = black_box(nest);
        if depth == 0 {
            return 1;
        }
        again(depth - 1).wrapping_mul(3).wrapping_add(depth)
    }

    fn nest_want(depth: u64) -> u64 {
        (1..=depth).fold(1u64, |acc, d| acc.wrapping_mul(3).wrapping_add(d))
    }

    #[test]
    fn the_exit_floor_returns_to_the_caller_with_every_register_and_the_value() {
        check_every_argument_register::<1>(true);
        let f = nest as extern "C" fn(u64) -> u64 as usize;
        match crate::arch::attach_floor(f, None, true) {
            Ok(at) => assert!(is_patched(at), "the nesting site was not patched"),
            Err(e) => {
                println!("skipped: cannot patch here: {e}");
                return;
            }
        }
        for depth in [0, 1, 5, 15, 16, 17, 40] {
            assert_eq!(nest(black_box(depth)), nest_want(depth), "depth {depth}");
        }
        check_bench_target(
            prepare_trampoline_floor_exit,
            trampoline_floor_exit_call,
            37,
        );
    }
}
