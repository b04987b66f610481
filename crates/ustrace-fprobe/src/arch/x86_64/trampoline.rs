//! Trampolines: how a patched function reaches the dispatcher and how its return comes back.
//!
//! ```text
//!  caller                  probed function             site stubs (near func)       shared code (this crate)
//!  ------                  ---------------             ----------------------       ------------------------
//!  call func ───────────►  func: [endbr64]
//!                          patch_at: jmp entry_stub ──► entry_stub:
//!                                                        push r11
//!                                                        mov r11, &Site
//!                                                        jmp (rel32 or [abs]) ──────► entry_trampoline:
//!                                                                                      sub rsp, 432; save every register
//!                                                                                      call dispatch_entry(r11, regs)
//!                                                                                        - entry handlers
//!                                                                                        - maybe: shadow push {ret, sp},
//!                                                                                          [sp] = return_trampoline
//!                                                                                      restore; jmp [r11->orig_stub]
//!                                                                                        (hooked: pop the slot, jmp to
//!                                                                                        call_hooked: call [r11->orig_stub],
//!                                                                                        which pushes return_trampoline)
//!                                                       orig_stub:  ◄──────────────────┘
//!                                                        pop r11
//!                                                        relocated prologue
//!                          resume: ... body ... ◄────── jmp [abs resume]
//!                          ret ─────────────────────────────────────────────────────► return_trampoline:
//!                                                                                      sub rsp, 8 (slot for the real ret)
//!                                                                                      save PtRegs; call dispatch_exit(regs)
//!                                                                                        - shadow pop, [slot] = real ret
//!                                                                                        - exit handlers
//!  caller resumes ◄──────────────────────────────────────────────────────────────────── restore; ret
//! ```
//!
//! No register may change across a probed call that the function itself leaves alone, not
//! even the ABI's call-clobbered ones: GCC's interprocedural register allocation (`-fipa-ra`,
//! on at -O2 unless -pg is given) lets a caller keep values in them across a call to a
//! function it knows does not touch them. So `r11`, which carries the site, is pushed by the
//! entry stub and popped by the first instruction of the original code; both trampolines
//! save and restore every general-purpose register and `xmm0`-`xmm15`, and keep the stack
//! 16-byte aligned for the Rust dispatcher. Both carry CFI, so a backtrace taken in a handler
//! walks through them to the real caller. Flags are not preserved (no compiler keeps a value
//! in them across a call). The upper halves of the `ymm`/`zmm` registers are not saved: the
//! handlers' Rust code uses only SSE, though the C library's string functions it may call
//! clear them (`vzeroupper`); a program built for AVX that keeps a 256-bit value live across a
//! call to a probed function would lose its upper half.
//!
//! Stub memory is mapped read-execute and filled through `/proc/self/mem` (as patched text
//! is): no W+X mapping, and no `mprotect` flips that could race with a thread running an older
//! stub of the same page. Stubs built one after another lie one after another in their chunk;
//! they are queued and written together, one write per run, before any jump to them is
//! patched in ([`flush_code`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::regs::{PtRegs, PT_REGS_SIZE};

// The frames. Both trampolines put the handlers' PtRegs at rsp + 8 and xmm8-xmm15 right
// after it, so every 16-byte slot is 16-byte aligned (misaligned, one crossed a cache line at
// some stack offsets and its store could not be forwarded to the reload: up to 10 ns more
// per hit), and leave rsp 16-byte aligned for the call; PtRegs.sp, the return address's
// slot, is at rsp + 440 in both.
//
//   entry (rsp 0 mod 16 on entry: the stub pushed r11)      return (after `sub rsp, 8`)
//   rsp + 0     the site, kept across the dispatcher call    unused
//   rsp + 8     PtRegs (xmm0-7 at rsp + 176)                 PtRegs
//   rsp + 304   xmm8-xmm15                                   xmm8-xmm15
//   rsp + 432   the caller's r11                             unused
//   rsp + 440   return address                               the slot for the real return
const PT_REGS_AT: usize = 8;
const HIGH_XMM_AT: usize = PT_REGS_AT + PT_REGS_SIZE;
const ENTRY_FRAME: usize = 432;
const EXIT_FRAME: usize = 440;
const RETURN_SLOT: usize = 440;
const _: () = assert!(PT_REGS_SIZE == 296 && HIGH_XMM_AT == 304);
const _: () = assert!((PT_REGS_AT + std::mem::offset_of!(PtRegs, xmm)).is_multiple_of(16));
const _: () = assert!(HIGH_XMM_AT.is_multiple_of(16) && HIGH_XMM_AT + 8 * 16 == ENTRY_FRAME);
// rsp is 0 mod 16 when the entry trampoline starts (a call's 8, plus the stub's push), and 8
// when the return trampoline has made its slot.
const _: () = assert!(ENTRY_FRAME.is_multiple_of(16) && EXIT_FRAME % 16 == 8);
const _: () = assert!(ENTRY_FRAME + 8 == RETURN_SLOT && EXIT_FRAME == RETURN_SLOT);

// The first stores of both frames: xmm0-5, each beside one of the callee-saved registers
// (kept for the handlers' PtRegs, which the Rust dispatcher preserves anyway).
macro_rules! save_low_xmm_and_callee_saved {
    () => {
        concat!(
            "movups [rsp + 176 + 0*16], xmm0\n",
            "mov [rsp + 8 + 0*8], r15\n",
            "movups [rsp + 176 + 1*16], xmm1\n",
            "mov [rsp + 8 + 1*8], r14\n",
            "movups [rsp + 176 + 2*16], xmm2\n",
            "mov [rsp + 8 + 2*8], r13\n",
            "movups [rsp + 176 + 3*16], xmm3\n",
            "mov [rsp + 8 + 3*8], r12\n",
            "movups [rsp + 176 + 4*16], xmm4\n",
            "mov [rsp + 8 + 4*8], rbp\n",
            "movups [rsp + 176 + 5*16], xmm5\n",
            "mov [rsp + 8 + 5*8], rbx\n",
        )
    };
}

// Every register is kept, not only the ABI's callee-saved ones and the arguments: GCC's
// interprocedural register allocation (`-fipa-ra`, on at -O2 unless -pg is given) lets a
// caller keep values in call-clobbered registers across a call to a function it knows does
// not touch them (glibc's ld.so keeps a pointer in r11 across its calls to dfs_traversal),
// so neither path may change a register the probed function itself would not. Each xmm
// store sits beside an integer one: eight FP stores in a row cost about 1.5 ns more on Zen 4
// than the same stores spread among the others.
macro_rules! save_regs {
    () => {
        concat!(
            save_low_xmm_and_callee_saved!(),
            "movups [rsp + 176 + 6*16], xmm6\n",
            "mov [rsp + 8 + 7*8], r10\n",
            "movups [rsp + 176 + 7*16], xmm7\n",
            "mov [rsp + 8 + 8*8], r9\n",
            "movups [rsp + 304 + 0*16], xmm8\n",
            "mov [rsp + 8 + 9*8], r8\n",
            "movups [rsp + 304 + 1*16], xmm9\n",
            "mov [rsp + 8 + 10*8], rax\n",
            "movups [rsp + 304 + 2*16], xmm10\n",
            "mov [rsp + 8 + 11*8], rcx\n",
            "movups [rsp + 304 + 3*16], xmm11\n",
            "mov [rsp + 8 + 12*8], rdx\n",
            "movups [rsp + 304 + 4*16], xmm12\n",
            "mov [rsp + 8 + 13*8], rsi\n",
            "movups [rsp + 304 + 5*16], xmm13\n",
            "mov [rsp + 8 + 14*8], rdi\n",
            // The caller's r11, which the entry stub pushed before it took r11 for the site.
            "movups [rsp + 304 + 6*16], xmm14\n",
            "mov rax, [rsp + 432]\n",
            "movups [rsp + 304 + 7*16], xmm15\n",
            "mov [rsp + 8 + 6*8], rax\n",
            "mov qword ptr [rsp + 8 + 15*8], -1\n",
            // cs and flags (0, 0) in one 16-byte store, then sp and ss (0) in another; xmm8
            // and xmm9 are saved above and put back with the rest.
            "xorps xmm8, xmm8\n",
            "movups [rsp + 8 + 17*8], xmm8\n",
            "lea rax, [rsp + 440]\n",
            "movq xmm9, rax\n",
            "movups [rsp + 8 + 19*8], xmm9\n",
        )
    };
}

// At a return every register but the callee-saved ones (which the Rust dispatcher keeps) may
// still be live in the caller: all are saved, the PtRegs fields included.
macro_rules! save_return_state {
    () => {
        concat!(
            save_low_xmm_and_callee_saved!(),
            "movups [rsp + 176 + 6*16], xmm6\n",
            "mov [rsp + 8 + 6*8], r11\n",
            "movups [rsp + 176 + 7*16], xmm7\n",
            "mov [rsp + 8 + 7*8], r10\n",
            "movups [rsp + 304 + 0*16], xmm8\n",
            "mov [rsp + 8 + 8*8], r9\n",
            "movups [rsp + 304 + 1*16], xmm9\n",
            "mov [rsp + 8 + 9*8], r8\n",
            "movups [rsp + 304 + 2*16], xmm10\n",
            "mov [rsp + 8 + 10*8], rax\n",
            "movups [rsp + 304 + 3*16], xmm11\n",
            "mov [rsp + 8 + 11*8], rcx\n",
            "movups [rsp + 304 + 4*16], xmm12\n",
            "mov [rsp + 8 + 12*8], rdx\n",
            "movups [rsp + 304 + 5*16], xmm13\n",
            "mov [rsp + 8 + 13*8], rsi\n",
            "movups [rsp + 304 + 6*16], xmm14\n",
            "mov [rsp + 8 + 14*8], rdi\n",
            "movups [rsp + 304 + 7*16], xmm15\n",
            "lea rax, [rsp + 440]\n",
            "mov [rsp + 8 + 19*8], rax\n",
        )
    };
}

// The call-clobbered registers as saved. Handlers get `&PtRegs`, so nothing in the frame
// changes; callee-saved registers (rbx, rbp, r12-r15) come back intact from the Rust
// dispatcher and need no reload. r11 is not here: at entry it still holds the site (the
// stub's own code pops the caller's), at a return it is reloaded last.
macro_rules! restore_scratch {
    () => {
        concat!(
            "movups xmm0, [rsp + 176 + 0*16]\n",
            "mov r10, [rsp + 8 + 7*8]\n",
            "movups xmm1, [rsp + 176 + 1*16]\n",
            "mov r9, [rsp + 8 + 8*8]\n",
            "movups xmm2, [rsp + 176 + 2*16]\n",
            "mov r8, [rsp + 8 + 9*8]\n",
            "movups xmm3, [rsp + 176 + 3*16]\n",
            "mov rax, [rsp + 8 + 10*8]\n",
            "movups xmm4, [rsp + 176 + 4*16]\n",
            "mov rcx, [rsp + 8 + 11*8]\n",
            "movups xmm5, [rsp + 176 + 5*16]\n",
            "mov rdx, [rsp + 8 + 12*8]\n",
            "movups xmm6, [rsp + 176 + 6*16]\n",
            "mov rsi, [rsp + 8 + 13*8]\n",
            "movups xmm7, [rsp + 176 + 7*16]\n",
            "mov rdi, [rsp + 8 + 14*8]\n",
            "movups xmm8, [rsp + 304 + 0*16]\n",
            "movups xmm9, [rsp + 304 + 1*16]\n",
            "movups xmm10, [rsp + 304 + 2*16]\n",
            "movups xmm11, [rsp + 304 + 3*16]\n",
            "movups xmm12, [rsp + 304 + 4*16]\n",
            "movups xmm13, [rsp + 304 + 5*16]\n",
            "movups xmm14, [rsp + 304 + 6*16]\n",
            "movups xmm15, [rsp + 304 + 7*16]\n",
        )
    };
}

/// The entry trampoline's code as `$name`, calling `$dispatch(site, regs) -> bool` and, for a
/// hooked call, leaving through `$call_hooked` (the one placed just before the return
/// trampoline the dispatcher wrote into the slot). The real trampoline and the bench's floor
/// trampolines ([`crate::bench`]) are all expanded from here, so the floor figures measure
/// exactly the instructions a hit runs around the dispatcher call.
macro_rules! entry_trampoline {
    ($name:literal, $dispatch:path, $call_hooked:literal) => {
        std::arch::global_asm!(
            ".pushsection .text.ustrace_fprobe_trampolines,\"ax\",@progbits",
            ".balign 16",
            concat!(".globl ", $name),
            concat!(".hidden ", $name),
            concat!(".type ", $name, ",@function"),
            concat!($name, ":"),
            ".cfi_startproc",
            // The entry stub pushed the caller's r11 above the return address.
            ".cfi_def_cfa_offset 16",
            ".cfi_offset r11, -16",
            "sub rsp, 432",
            ".cfi_adjust_cfa_offset 432",
            save_regs!(),
            // The site, kept across the call (which may use r11).
            "mov [rsp], r11",
            "mov rdi, r11",
            "lea rsi, [rsp + 8]",
            "call {entry}",
            "mov r11, [rsp]",
            // Did the dispatcher hook this call's return (the slot now holds
            // return_trampoline)? Asked of it rather than of the slot: a function tail-called
            // from a hooked one finds the trampoline there already, and must jump, so that the
            // caller's hooked return still meets the return-stack entry of the caller's own
            // entry `call`.
            "test al, al",
            ".cfi_remember_state",
            "jnz 2f",
            restore_scratch!(),
            "add rsp, 432",
            ".cfi_adjust_cfa_offset -432",
            // To the site's original code, which starts by popping the caller's r11.
            "jmp qword ptr [r11]",
            "2:",
            ".cfi_restore_state",
            // Drop the hooked slot and push the same value back with a `call` from just before
            // return_trampoline: memory ends up as the dispatcher left it, and the
            // return-stack buffer now predicts the probed function's `ret` into
            // return_trampoline, whose own `ret` then pairs with the caller's `call` (an entry
            // trampoline that jumped would leave both returns mispredicted). The real return
            // address is only in the shadow stack here. The call's target (the original code
            // past its `pop r11`) goes into the slot, which is just below the stack pointer (in
            // the red zone, which no signal frame overwrites) when the call reads it.
            "mov rax, [r11]",
            "add rax, 2",
            "mov [rsp + 440], rax",
            restore_scratch!(),
            "add rsp, 432",
            ".cfi_adjust_cfa_offset -432",
            "pop r11",
            ".cfi_adjust_cfa_offset -8",
            ".cfi_same_value r11",
            "add rsp, 8",
            ".cfi_def_cfa_offset 0",
            ".cfi_undefined rip",
            concat!("jmp ", $call_hooked),
            ".cfi_endproc",
            concat!(".size ", $name, ", . - ", $name),
            ".popsection",
            entry = sym $dispatch,
        );
    };
}

entry_trampoline!(
    "ustrace_fprobe_entry_trampoline",
    crate::dispatch::entry_shim,
    "ustrace_fprobe_call_hooked"
);
entry_trampoline!(
    "ustrace_fprobe_floor_trampoline",
    floor_dispatch,
    "ustrace_fprobe_floor_call_hooked"
);
entry_trampoline!(
    "ustrace_fprobe_floor_hook_trampoline",
    floor_hook_dispatch,
    "ustrace_fprobe_floor_call_hooked"
);

/// The floor trampoline's dispatcher: nothing, and "not hooked".
extern "C" fn floor_dispatch(_site: *const crate::dispatch::Site, _regs: *mut PtRegs) -> bool {
    false
}

/// The least an entry that hooks its return must do: keep the real return address (on a
/// per-thread stack of return addresses) and put the floor return trampoline in its slot.
/// Paired with [`floor_exit_dispatch`]. A call nested deeper than the stack runs unhooked.
extern "C" fn floor_hook_dispatch(_site: *const crate::dispatch::Site, regs: *mut PtRegs) -> bool {
    FLOOR_RETURNS.with(|stack| {
        let depth = stack.depth.get();
        let Some(slot) = stack.returns.get(depth) else {
            return false;
        };
        // SAFETY: `regs` is the trampoline's frame; its `sp` points at this call's return
        // address, which the probed function's `ret` will consume: it is kept here and the
        // floor return trampoline goes in its place (put back by `floor_exit_dispatch`).
        unsafe {
            let sp = (*regs).sp as *mut usize;
            slot.set(sp.read());
            sp.write(ustrace_fprobe_floor_return_trampoline as *const () as usize);
        }
        stack.depth.set(depth + 1);
        true
    })
}

/// The floor return trampoline's dispatcher: put the real return address back.
extern "C" fn floor_exit_dispatch(regs: *mut PtRegs) {
    FLOOR_RETURNS.with(|stack| {
        let depth = stack.depth.get() - 1;
        // SAFETY: the return trampoline's frame; its `sp` is the slot its `ret` takes.
        unsafe { ((*regs).sp as *mut usize).write(stack.returns[depth].get()) };
        stack.depth.set(depth);
    })
}

/// The floor figures' return addresses of one thread (the bench's calls are not nested, but
/// a test may nest them).
struct FloorReturns {
    depth: std::cell::Cell<usize>,
    returns: [std::cell::Cell<usize>; 16],
}

thread_local! {
    static FLOOR_RETURNS: FloorReturns = const {
        FloorReturns {
            depth: std::cell::Cell::new(0),
            returns: [const { std::cell::Cell::new(0) }; 16],
        }
    };
}

/// A return trampoline as `$name`, calling `$exit(regs)`, which must write the real return
/// address into `regs.sp`'s slot; `$call_hooked` is placed just before it (see the hooked
/// path of `entry_trampoline!`). The real one and the bench's floor one are both expanded
/// from here.
macro_rules! return_trampoline {
    ($name:literal, $exit:path, $call_hooked:literal) => {
std::arch::global_asm!(
    ".pushsection .text.ustrace_fprobe_trampolines,\"ax\",@progbits",
    // The call's return address is return_trampoline itself, so an unwinder that looks up
    // (return_trampoline - 1) lands here, where the return address is undefined: it stops
    // instead of applying someone else's rules.
    ".balign 16",
    concat!(".globl ", $call_hooked),
    concat!(".hidden ", $call_hooked),
    concat!($call_hooked, ":"),
    ".cfi_startproc",
    ".cfi_def_cfa rsp, 0",
    ".cfi_undefined rip",
    "call qword ptr [rsp - 8]",
    ".cfi_endproc",
    concat!(".globl ", $name),
    concat!(".hidden ", $name),
    concat!(".type ", $name, ",@function"),
    concat!($name, ":"),
    ".cfi_startproc",
    ".cfi_def_cfa rsp, 0",
    ".cfi_undefined rip",
    "sub rsp, 8",
    ".cfi_def_cfa_offset 8",
    ".cfi_offset rip, -8",
    "sub rsp, 440",
    ".cfi_adjust_cfa_offset 440",
    save_return_state!(),
    "lea rdi, [rsp + 8]",
    "call {exit}",
    restore_scratch!(),
    "mov r11, [rsp + 8 + 6*8]",
    "add rsp, 440",
    ".cfi_adjust_cfa_offset -440",
    // The probed function's `ret` consumed the return-stack-buffer entry of the entry
    // trampoline's `call`; the caller's is next, and this `ret` uses it.
    "ret",
    ".cfi_endproc",
    concat!(".size ", $name, ", . - ", $name),
    ".popsection",
    exit = sym $exit,
);
    };
}

return_trampoline!(
    "ustrace_fprobe_return_trampoline",
    crate::dispatch::exit_shim,
    "ustrace_fprobe_call_hooked"
);
return_trampoline!(
    "ustrace_fprobe_floor_return_trampoline",
    floor_exit_dispatch,
    "ustrace_fprobe_floor_call_hooked"
);

extern "C" {
    fn ustrace_fprobe_entry_trampoline();
    fn ustrace_fprobe_floor_trampoline();
    fn ustrace_fprobe_floor_hook_trampoline();
    fn ustrace_fprobe_return_trampoline();
    fn ustrace_fprobe_floor_return_trampoline();
}

/// Address the dispatcher writes over a hooked return address.
pub(crate) fn return_trampoline() -> usize {
    ustrace_fprobe_return_trampoline as *const () as usize
}

pub(crate) fn entry_trampoline() -> usize {
    ustrace_fprobe_entry_trampoline as *const () as usize
}

/// The bench's floor trampoline: the entry trampoline calling an empty function.
pub(crate) fn floor_trampoline() -> usize {
    ustrace_fprobe_floor_trampoline as *const () as usize
}

/// The bench's entry-and-return floor trampoline: the entry trampoline calling a function
/// that only hooks the return, to the return trampoline calling one that only unhooks it.
pub(crate) fn floor_hook_trampoline() -> usize {
    ustrace_fprobe_floor_hook_trampoline as *const () as usize
}

// ---------------------------------------------------------------------------------------------
// Executable memory within rel32 reach of the patched functions.

const CHUNK: usize = 1 << 20;
const REACH: usize = (1 << 31) - 2 * CHUNK;

struct Chunk {
    base: usize,
    used: usize,
}

static CHUNKS: Mutex<Vec<Chunk>> = Mutex::new(Vec::new());
pub(crate) static CODE_BYTES: AtomicUsize = AtomicUsize::new(0);

fn within_reach(base: usize, target: usize) -> bool {
    base.abs_diff(target) < REACH && (base + CHUNK).abs_diff(target) < REACH
}

const USER_TOP: usize = 0x7fff_ffff_f000;

/// Free gaps between current mappings, from /proc/self/maps.
fn gaps() -> Vec<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut prev_end = 0x10000usize;
    let mut out = Vec::new();
    for line in maps.lines() {
        let Some((range, _)) = line.split_once(' ') else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        if a >= USER_TOP {
            break; // [vsyscall]
        }
        if a > prev_end {
            out.push((prev_end, a));
        }
        prev_end = prev_end.max(b);
    }
    if prev_end < USER_TOP {
        out.push((prev_end, USER_TOP));
    }
    out
}

fn map_chunk_near(target: usize) -> Result<usize, String> {
    for _attempt in 0..4 {
        let mut best: Option<usize> = None;
        for (a, b) in gaps() {
            if b <= a || b - a < CHUNK + 2 * 4096 {
                continue;
            }
            // Leave a guard page on each side of the neighbours.
            let lo = a + 4096;
            let hi = b - 4096 - CHUNK;
            let cand = target.clamp(lo, hi) & !0xfff;
            let cand = cand.max(lo);
            if cand <= hi && within_reach(cand, target) {
                best = match best {
                    Some(x) if x.abs_diff(target) <= cand.abs_diff(target) => Some(x),
                    _ => Some(cand),
                };
            }
        }
        let Some(addr) = best else {
            return Err(format!("no free address range within 2 GiB of {target:#x}"));
        };
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; we own the result.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                CHUNK,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED && p as usize == addr {
            return Ok(addr);
        }
        if p != libc::MAP_FAILED {
            // SAFETY: an old kernel treated the flag as a hint and mapped elsewhere: undo it.
            unsafe { libc::munmap(p, CHUNK) };
        }
    }
    Err(format!("could not map trampoline memory near {target:#x}"))
}

/// Reserves `len` bytes of stub memory within rel32 reach of `target`. Never freed: a thread may
/// still execute a stub long after its probe was removed. The memory is mapped read-execute
/// only and written through `/proc/self/mem` like patched text, so no mapping of the process
/// is ever writable and executable at once.
pub(crate) fn alloc_code_near(target: usize, len: usize) -> Result<usize, String> {
    let len = (len + 15) & !15;
    let mut chunks = CHUNKS.lock().unwrap_or_else(|e| e.into_inner());
    for c in chunks.iter_mut() {
        if c.used + len <= CHUNK && within_reach(c.base, target) {
            let at = c.base + c.used;
            c.used += len;
            CODE_BYTES.fetch_add(len, Ordering::Relaxed);
            return Ok(at);
        }
    }
    let base = map_chunk_near(target)?;
    chunks.push(Chunk { base, used: len });
    CODE_BYTES.fetch_add(len, Ordering::Relaxed);
    Ok(base)
}

/// Code generated for one site.
pub(crate) struct SiteCode {
    pub entry_stub: usize,
    /// Where the entry trampoline continues: `pop r11` (the caller's, pushed by the entry
    /// stub), then the relocated prologue.
    pub orig_stub: usize,
    /// The relocated prologue itself, where a thread that did not come through the entry
    /// stub (one that met the int3 of a patch in progress) resumes.
    pub prologue_at: usize,
    pub patch_at: usize,
    pub original: Vec<u8>,
    pub interior: Vec<(usize, usize)>,
}

const ENTRY_STUB_LEN: usize = 32;
const PUSH_R11: [u8; 2] = [0x41, 0x53];
/// Two bytes long: the entry trampoline's hooked path calls `orig_stub + 2`.
const POP_R11: [u8; 2] = [0x41, 0x5b];

/// Writes the analysed function's entry stub (bound to `site`) and relocated
/// prologue into fresh stub memory (queued for [`flush_code`]). Nothing is patched yet.
pub(crate) fn build_site(
    prologue: super::insn::Prologue,
    site: usize,
    trampoline: usize,
) -> Result<SiteCode, String> {
    let mem = alloc_code_near(
        prologue.patch_at,
        ENTRY_STUB_LEN + super::insn::MAX_RELOCATED + 32,
    )?;
    let entry_stub = mem;
    let orig_stub = mem + ENTRY_STUB_LEN;
    let prologue_at = orig_stub + POP_R11.len();
    let (relocated, interior) = super::insn::relocate(&prologue, prologue_at)?;
    let mut stub = Vec::with_capacity(ENTRY_STUB_LEN);
    stub.extend_from_slice(&PUSH_R11);
    stub.extend_from_slice(&[0x49, 0xbb]); // mov r11, imm64
    stub.extend_from_slice(&(site as u64).to_le_bytes());
    // A direct jump when the trampoline is within reach (stubs lie near their function, so
    // always for the program's own functions): no load and no indirect-branch prediction.
    let from = entry_stub + stub.len() + 5;
    match i32::try_from(trampoline as i64 - from as i64) {
        Ok(rel) => {
            stub.push(0xe9);
            stub.extend_from_slice(&rel.to_le_bytes());
        }
        Err(_) => stub.extend_from_slice(&super::insn::abs_jmp(trampoline)),
    }
    assert!(stub.len() <= ENTRY_STUB_LEN);
    // Both ranges were just carved out of a chunk and nothing executes them until a later
    // patch publishes them (the patch writes them first and serialises every core).
    queue_code(entry_stub, &stub);
    let mut orig = POP_R11.to_vec();
    orig.extend_from_slice(&relocated);
    queue_code(orig_stub, &orig);
    Ok(SiteCode {
        entry_stub,
        orig_stub,
        prologue_at,
        patch_at: prologue.patch_at,
        original: prologue.original,
        interior,
    })
}

/// Stub bytes built but not written yet, as runs `(start, bytes)`.
static PENDING: Mutex<Vec<(usize, Vec<u8>)>> = Mutex::new(Vec::new());

/// Largest gap between two queued stubs that one run bridges (far less than the guard page
/// `map_chunk_near` leaves around every chunk, so a bridged gap never leaves its chunk).
const MAX_GAP: usize = 256;

/// Queues `bytes` for `addr` (stub memory that nothing executes yet), joining them to the run
/// they follow closely. The bytes of a gap are carried with the values they hold now.
fn queue_code(addr: usize, bytes: &[u8]) {
    let mut pending = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((start, run)) = pending.last_mut() {
        let end = *start + run.len();
        if addr >= end && addr - end <= MAX_GAP {
            // SAFETY: `end - 1` and `addr` both lie in stub chunks, and two different chunks
            // (or a chunk and any other mapping) are at least a guard page apart, so the gap
            // is readable memory of one chunk; only build_site writes chunk memory, and the
            // gap is not queued (allocation is monotonic in a chunk, so a later stub would be
            // the last run) nor being written (the lock is held).
            let gap = unsafe { std::slice::from_raw_parts(end as *const u8, addr - end) };
            run.extend_from_slice(gap);
            run.extend_from_slice(bytes);
            return;
        }
    }
    pending.push((addr, bytes.to_vec()));
}

/// Writes every queued stub. Called before a patch publishes a jump to a stub; a run that
/// could not be written stays queued (and the patch fails), so no jump ever reaches a stub
/// that is not in memory.
pub(crate) fn flush_code() -> Result<(), crate::Error> {
    let mut pending = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    let mut written = 0;
    let mut res = Ok(());
    for (start, run) in pending.iter() {
        if let Err(e) = super::write_code(*start, run) {
            res = Err(e);
            break;
        }
        written += 1;
    }
    pending.drain(..written);
    res
}
