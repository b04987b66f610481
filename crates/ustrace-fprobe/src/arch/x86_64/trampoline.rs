//! Trampolines: how a patched function reaches the dispatcher and how its return comes back.
//!
//! ```text
//!  caller                  probed function             site stubs (near func)       shared code (this crate)
//!  ------                  ---------------             ----------------------       ------------------------
//!  call func ───────────►  func: [endbr64]
//!                          patch_at: jmp entry_stub ──► entry_stub:
//!                                                        mov r11, &Site
//!                                                        jmp (rel32 or [abs]) ──────► entry_trampoline:
//!                                                                                      sub rsp, 312; save PtRegs+xmm0-7
//!                                                                                      call dispatch_entry(r11, regs)
//!                                                                                        - entry handlers
//!                                                                                        - maybe: shadow push {ret, sp},
//!                                                                                          [sp] = return_trampoline
//!                                                                                      restore; jmp [r11->orig_stub]
//!                                                                                        (hooked: pop the slot, jmp to
//!                                                                                        call_hooked: call [r11->orig_stub],
//!                                                                                        which pushes return_trampoline)
//!                                                       orig_stub:  ◄──────────────────┘
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
//! `r11` carries the site because it is a scratch register that no x86_64 SysV function expects
//! to hold a value at entry. The trampolines keep the stack 16-byte aligned for the Rust
//! dispatcher and save `xmm0`-`xmm7` (float arguments / return values). Both carry CFI, so a
//! backtrace taken in a handler walks through them to the real caller. Flags are not preserved
//! across the entry trampoline (they carry no value at a function boundary).
//!
//! Stub memory is mapped read-execute and filled through `/proc/self/mem` (as patched text
//! is): no W+X mapping, and no `mprotect` flips that could race with a thread running an older
//! stub of the same page. Stubs built one after another lie one after another in their chunk;
//! they are queued and written together, one write per run, before any jump to them is
//! patched in ([`flush_code`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::regs::{PtRegs, PT_REGS_SIZE};

macro_rules! save_regs {
    () => {
        concat!(
            // Each xmm store beside an integer one: measured on Zen 4, eight FP stores in a
            // row cost about 1.5 ns more than the same stores spread among the others.
            "movups [rsp + 8 + 168 + 0*16], xmm0\n",
            "mov [rsp + 8 + 0*8], r15\n",
            "movups [rsp + 8 + 168 + 1*16], xmm1\n",
            "mov [rsp + 8 + 1*8], r14\n",
            "movups [rsp + 8 + 168 + 2*16], xmm2\n",
            "mov [rsp + 8 + 2*8], r13\n",
            "movups [rsp + 8 + 168 + 3*16], xmm3\n",
            "mov [rsp + 8 + 3*8], r12\n",
            "movups [rsp + 8 + 168 + 4*16], xmm4\n",
            "mov [rsp + 8 + 4*8], rbp\n",
            "movups [rsp + 8 + 168 + 5*16], xmm5\n",
            "mov [rsp + 8 + 5*8], rbx\n",
            "movups [rsp + 8 + 168 + 6*16], xmm6\n",
            "mov [rsp + 8 + 6*8], r11\n",
            "movups [rsp + 8 + 168 + 7*16], xmm7\n",
            "mov [rsp + 8 + 7*8], r10\n",
            "mov [rsp + 8 + 8*8], r9\n",
            "mov [rsp + 8 + 9*8], r8\n",
            "mov [rsp + 8 + 10*8], rax\n",
            "mov [rsp + 8 + 11*8], rcx\n",
            "mov [rsp + 8 + 12*8], rdx\n",
            "mov [rsp + 8 + 13*8], rsi\n",
            "mov [rsp + 8 + 14*8], rdi\n",
            "mov qword ptr [rsp + 8 + 15*8], -1\n",
            // cs and flags (0, 0) in one 16-byte store, then sp and ss (0) in another:
            // xmm8/xmm9 carry nothing at a function's entry (SysV passes arguments in
            // xmm0-7 only), and the stores are what this path is bound by.
            "xorps xmm8, xmm8\n",
            "movups [rsp + 8 + 17*8], xmm8\n",
            "lea rax, [rsp + 312]\n",
            "movq xmm9, rax\n",
            "movups [rsp + 8 + 19*8], xmm9\n",
        )
    };
}

// At a return only the return values, the callee-saved registers and the stack pointer mean
// anything; the other PtRegs fields are left unspecified (not stored, to keep the exit cheap).
macro_rules! save_return_state {
    () => {
        concat!(
            "movups [rsp + 8 + 168 + 0*16], xmm0\n",
            "mov [rsp + 8 + 0*8], r15\n",
            "movups [rsp + 8 + 168 + 1*16], xmm1\n",
            "mov [rsp + 8 + 1*8], r14\n",
            "mov [rsp + 8 + 2*8], r13\n",
            "mov [rsp + 8 + 3*8], r12\n",
            "mov [rsp + 8 + 4*8], rbp\n",
            "mov [rsp + 8 + 5*8], rbx\n",
            "mov [rsp + 8 + 10*8], rax\n",
            "mov [rsp + 8 + 12*8], rdx\n",
            "lea rax, [rsp + 312]\n",
            "mov [rsp + 8 + 19*8], rax\n",
        )
    };
}

// Handlers get `&PtRegs`, so nothing in the frame changes; callee-saved registers (rbx, rbp,
// r12-r15) come back intact from the Rust dispatcher and need no reload.
macro_rules! restore_args {
    () => {
        concat!(
            "movups xmm0, [rsp + 8 + 168 + 0*16]\n",
            "movups xmm1, [rsp + 8 + 168 + 1*16]\n",
            "movups xmm2, [rsp + 8 + 168 + 2*16]\n",
            "movups xmm3, [rsp + 8 + 168 + 3*16]\n",
            "movups xmm4, [rsp + 8 + 168 + 4*16]\n",
            "movups xmm5, [rsp + 8 + 168 + 5*16]\n",
            "movups xmm6, [rsp + 8 + 168 + 6*16]\n",
            "movups xmm7, [rsp + 8 + 168 + 7*16]\n",
            "mov r11, [rsp + 8 + 6*8]\n",
            "mov r10, [rsp + 8 + 7*8]\n",
            "mov r9, [rsp + 8 + 8*8]\n",
            "mov r8, [rsp + 8 + 9*8]\n",
            "mov rax, [rsp + 8 + 10*8]\n",
            "mov rcx, [rsp + 8 + 11*8]\n",
            "mov rdx, [rsp + 8 + 12*8]\n",
            "mov rsi, [rsp + 8 + 13*8]\n",
            "mov rdi, [rsp + 8 + 14*8]\n",
        )
    };
}

// At a return only the return-value registers carry anything the caller may read.
macro_rules! restore_return_values {
    () => {
        concat!(
            "movups xmm0, [rsp + 8 + 168 + 0*16]\n",
            "movups xmm1, [rsp + 8 + 168 + 1*16]\n",
            "mov rax, [rsp + 8 + 10*8]\n",
            "mov rdx, [rsp + 8 + 12*8]\n",
        )
    };
}

// The frame: `sub rsp, 312` from a function's entry (rsp 8 mod 16) leaves rsp 16-byte aligned
// for the call, and the PtRegs at rsp + 8 puts its xmm slots (offset 168) on 16-byte
// boundaries. Misaligned, one of the eight 16-byte slots crossed a cache line whenever the
// stack sat at some offsets mod 64, and its store could not be forwarded to the reload:
// about 10 ns more per hit in a microbenchmark, depending on where the stack was.
const _: () = assert!(PT_REGS_SIZE == 296);
const FRAME_AT: usize = 8;
const FRAME_SIZE: usize = 312;
const _: () = assert!(
    (FRAME_AT + std::mem::offset_of!(PtRegs, xmm)).is_multiple_of(16)
        && FRAME_SIZE % 16 == 8
        && FRAME_AT + PT_REGS_SIZE <= FRAME_SIZE
);

/// The entry trampoline's code as `$name`, calling `$dispatch(r11, regs) -> bool`. The real
/// trampoline and the bench's floor trampoline ([`crate::bench`]) are both expanded from
/// here, so the floor figure measures exactly the instructions a hit runs around the
/// dispatcher call.
macro_rules! entry_trampoline {
    ($name:literal, $dispatch:path) => {
        std::arch::global_asm!(
            ".pushsection .text.ustrace_fprobe_trampolines,\"ax\",@progbits",
            ".balign 16",
            concat!(".globl ", $name),
            concat!(".hidden ", $name),
            concat!(".type ", $name, ",@function"),
            concat!($name, ":"),
            ".cfi_startproc",
            "sub rsp, 312",
            ".cfi_adjust_cfa_offset 312",
            save_regs!(),
            "mov rdi, r11",
            "lea rsi, [rsp + 8]",
            "call {entry}",
            // Did the dispatcher hook this call's return (the slot now holds
            // return_trampoline)? Asked of it rather than of the slot: a function tail-called
            // from a hooked one finds the trampoline there already, and must jump, so that the
            // caller's hooked return still meets the return-stack entry of the caller's own
            // entry `call`.
            "test al, al",
            ".cfi_remember_state",
            "jnz 2f",
            restore_args!(),
            "add rsp, 312",
            ".cfi_adjust_cfa_offset -312",
            "jmp qword ptr [r11]",
            "2:",
            ".cfi_restore_state",
            restore_args!(),
            // Drop the hooked slot and push the same value back with a `call` from just before
            // return_trampoline: memory ends up as the dispatcher left it, and the
            // return-stack buffer now predicts the probed function's `ret` into
            // return_trampoline, whose own `ret` then pairs with the caller's `call` (an entry
            // trampoline that jumped would leave both returns mispredicted). The real return
            // address is only in the shadow stack here.
            "add rsp, 320",
            ".cfi_def_cfa_offset 0",
            ".cfi_undefined rip",
            "jmp ustrace_fprobe_call_hooked",
            ".cfi_endproc",
            concat!(".size ", $name, ", . - ", $name),
            ".popsection",
            entry = sym $dispatch,
        );
    };
}

entry_trampoline!(
    "ustrace_fprobe_entry_trampoline",
    crate::dispatch::entry_shim
);
entry_trampoline!("ustrace_fprobe_floor_trampoline", floor_dispatch);

/// The floor trampoline's dispatcher: nothing, and "not hooked".
extern "C" fn floor_dispatch(_site: *const crate::dispatch::Site, _regs: *mut PtRegs) -> bool {
    false
}

std::arch::global_asm!(
    ".pushsection .text.ustrace_fprobe_trampolines,\"ax\",@progbits",
    // The call's return address is return_trampoline itself, so an unwinder that looks up
    // (return_trampoline - 1) lands here, where the return address is undefined: it stops
    // instead of applying someone else's rules.
    ".balign 16",
    ".globl ustrace_fprobe_call_hooked",
    ".hidden ustrace_fprobe_call_hooked",
    "ustrace_fprobe_call_hooked:",
    ".cfi_startproc",
    ".cfi_def_cfa rsp, 0",
    ".cfi_undefined rip",
    "call qword ptr [r11]",
    ".cfi_endproc",
    ".globl ustrace_fprobe_return_trampoline",
    ".hidden ustrace_fprobe_return_trampoline",
    ".type ustrace_fprobe_return_trampoline,@function",
    "ustrace_fprobe_return_trampoline:",
    ".cfi_startproc",
    ".cfi_def_cfa rsp, 0",
    ".cfi_undefined rip",
    "sub rsp, 8",
    ".cfi_def_cfa_offset 8",
    ".cfi_offset rip, -8",
    "sub rsp, 312",
    ".cfi_adjust_cfa_offset 312",
    save_return_state!(),
    "lea rdi, [rsp + 8]",
    "call {exit}",
    restore_return_values!(),
    "add rsp, 312",
    ".cfi_adjust_cfa_offset -312",
    // The probed function's `ret` consumed the return-stack-buffer entry of the entry
    // trampoline's `call`; the caller's is next, and this `ret` uses it.
    "ret",
    ".cfi_endproc",
    ".size ustrace_fprobe_return_trampoline, . - ustrace_fprobe_return_trampoline",
    ".popsection",
    exit = sym crate::dispatch::exit_shim,
);

extern "C" {
    fn ustrace_fprobe_entry_trampoline();
    fn ustrace_fprobe_floor_trampoline();
    fn ustrace_fprobe_return_trampoline();
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
    pub orig_stub: usize,
    pub patch_at: usize,
    pub original: Vec<u8>,
    pub interior: Vec<(usize, usize)>,
}

const ENTRY_STUB_LEN: usize = 32;

/// Writes the analysed function's entry stub (bound to `site`, jumping to `trampoline`) and
/// relocated prologue into fresh stub memory (queued for [`flush_code`]). Nothing is patched
/// yet.
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
    let (relocated, interior) = super::insn::relocate(&prologue, orig_stub)?;
    let mut stub = Vec::with_capacity(ENTRY_STUB_LEN);
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
    queue_code(orig_stub, &relocated);
    Ok(SiteCode {
        entry_stub,
        orig_stub,
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
