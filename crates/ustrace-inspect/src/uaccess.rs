//! Fault-safe reads of this process's memory, without a syscall per read.
//!
//! Fetch arguments (`+0($arg1):ustring`), string filters and stack walking
//! dereference pointers that may be garbage. The kernel survives this with an
//! *exception table*; ustrace does the same in user space:
//!
//! ```text
//!   read(addr, buf) ──► ustrace_uaccess_copy (asm)
//!                          mov rax, [rsi]   ◄── listed in the exception table
//!                             │ fault                  (insn → fixup)
//!                             ▼
//!                      kernel delivers SIGSEGV/SIGBUS
//!                             ▼
//!                      on_fault(): RIP in table? ──yes──► RIP := fixup,
//!                             │ no                         RDX := fault address,
//!                             ▼                            return; the routine
//!                      previous handler (chained),         then returns "fault"
//!                      or default action (the program's
//!                      own crash still crashes)
//! ```
//!
//! A fault-free read is a call into a few instructions: no syscall, no lock,
//! no allocation. Only a faulting read pays for signal delivery.
//!
//! The table holds pairs of 32-bit offsets, each relative to its own
//! position (so it needs no relocation in a position-independent binary):
//! the address of an instruction that may fault and the address to resume at.
//!
//! # When another handler replaces ours
//!
//! A handler installed for SIGSEGV/SIGBUS *after* ours replaces it, and then a faulting
//! read would reach that handler instead of its fixup (and usually kill the process).
//! Checking on every read would cost a syscall, so the check is made where fault-prone
//! reads are set up instead: [`install`] asks the kernel for the current handlers
//! (`sigaction` with no new action) and, when ours was displaced, puts it back *in front
//! of* the newcomer, which it then chains to for every fault that is not ours (we
//! re-install and chain; we do not refuse the fetch). ustrace calls it each time a
//! dynamic event's probe is attached (an event being enabled: its fetches may
//! dereference anything); a program that installs handlers later may call it itself.
//! Between a displacement and the next [`install`], a faulting read is not safe (and
//! neither are the reads of string filters and stack capture, which use the same
//! handler).
//!
//! Chaining stays sound when the newcomer itself chains back to us (as runtimes that
//! save the previous handler do): every handler we displaced is remembered, oldest
//! first, and a fault that comes back to us through such a chain is passed to the one
//! displaced before, down to the default action — no loop.
//!
//! A read done while SIGSEGV is blocked (e.g. from inside another SIGSEGV handler) that
//! faults kills the process, as the kernel cannot deliver a blocked synchronous signal.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// A read touched memory that is not readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    addr: usize,
    len: usize,
    bad: usize,
}

impl Fault {
    /// Start of the requested range.
    pub fn addr(&self) -> usize {
        self.addr
    }
    /// Length of the requested range.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the requested range was empty (never for a real fault).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Address the CPU reported as inaccessible (0 for non-canonical
    /// addresses, which raise a general-protection fault instead).
    pub fn fault_addr(&self) -> usize {
        self.bad
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bad address 0x{:x} reading {} bytes at 0x{:x}",
            self.bad, self.len, self.addr
        )
    }
}

impl std::error::Error for Fault {}

/// Two return registers of the asm routines: rax (status or length) and rdx
/// (value or fault address).
#[repr(C)]
#[derive(Clone, Copy)]
struct Ret2 {
    rax: u64,
    rdx: u64,
}

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.ustrace_uaccess,\"ax\",@progbits",
    // copy(dst=rdi, src=rsi, len=rdx) -> rax 0 ok / 1 fault, rdx fault address
    ".p2align 4",
    ".globl ustrace_uaccess_copy",
    ".hidden ustrace_uaccess_copy",
    ".type ustrace_uaccess_copy,@function",
    "ustrace_uaccess_copy:",
    "    cmp rdx, 8",
    "    jb .Lustrace_copy_tail",
    ".Lustrace_copy_word:",
    "    mov rax, qword ptr [rsi]",
    "    mov qword ptr [rdi], rax",
    "    add rsi, 8",
    "    add rdi, 8",
    "    sub rdx, 8",
    "    cmp rdx, 8",
    "    jae .Lustrace_copy_word",
    ".Lustrace_copy_tail:",
    "    test rdx, rdx",
    "    jz .Lustrace_copy_done",
    ".Lustrace_copy_byte:",
    "    movzx eax, byte ptr [rsi]",
    "    mov byte ptr [rdi], al",
    "    inc rsi",
    "    inc rdi",
    "    dec rdx",
    "    jnz .Lustrace_copy_byte",
    ".Lustrace_copy_done:",
    "    xor eax, eax",
    "    xor edx, edx",
    "    ret",
    ".Lustrace_copy_fault:",
    "    mov eax, 1",
    "    ret",
    ".size ustrace_uaccess_copy, .-ustrace_uaccess_copy",
    // copy_str(dst=rdi, src=rsi, len=rdx) -> rax length before NUL (or len), or -1 on fault
    ".p2align 4",
    ".globl ustrace_uaccess_copy_str",
    ".hidden ustrace_uaccess_copy_str",
    ".type ustrace_uaccess_copy_str,@function",
    "ustrace_uaccess_copy_str:",
    "    xor ecx, ecx",
    "    test rdx, rdx",
    "    jz .Lustrace_str_done",
    ".Lustrace_str_byte:",
    "    movzx eax, byte ptr [rsi + rcx]",
    "    mov byte ptr [rdi + rcx], al",
    "    test al, al",
    "    jz .Lustrace_str_done",
    "    inc rcx",
    "    cmp rcx, rdx",
    "    jb .Lustrace_str_byte",
    ".Lustrace_str_done:",
    "    mov rax, rcx",
    "    xor edx, edx",
    "    ret",
    ".Lustrace_str_fault:",
    "    mov rax, -1",
    "    ret",
    ".size ustrace_uaccess_copy_str, .-ustrace_uaccess_copy_str",
    // load8/4/2/1(addr=rdi) -> rax 0 ok / 1 fault, rdx value or fault address
    ".p2align 4",
    ".globl ustrace_uaccess_load8",
    ".hidden ustrace_uaccess_load8",
    ".type ustrace_uaccess_load8,@function",
    "ustrace_uaccess_load8:",
    ".Lustrace_load8:",
    "    mov rdx, qword ptr [rdi]",
    "    xor eax, eax",
    "    ret",
    ".size ustrace_uaccess_load8, .-ustrace_uaccess_load8",
    ".p2align 4",
    ".globl ustrace_uaccess_load4",
    ".hidden ustrace_uaccess_load4",
    ".type ustrace_uaccess_load4,@function",
    "ustrace_uaccess_load4:",
    ".Lustrace_load4:",
    "    mov edx, dword ptr [rdi]",
    "    xor eax, eax",
    "    ret",
    ".size ustrace_uaccess_load4, .-ustrace_uaccess_load4",
    ".p2align 4",
    ".globl ustrace_uaccess_load2",
    ".hidden ustrace_uaccess_load2",
    ".type ustrace_uaccess_load2,@function",
    "ustrace_uaccess_load2:",
    ".Lustrace_load2:",
    "    movzx edx, word ptr [rdi]",
    "    xor eax, eax",
    "    ret",
    ".size ustrace_uaccess_load2, .-ustrace_uaccess_load2",
    ".p2align 4",
    ".globl ustrace_uaccess_load1",
    ".hidden ustrace_uaccess_load1",
    ".type ustrace_uaccess_load1,@function",
    "ustrace_uaccess_load1:",
    ".Lustrace_load1:",
    "    movzx edx, byte ptr [rdi]",
    "    xor eax, eax",
    "    ret",
    ".size ustrace_uaccess_load1, .-ustrace_uaccess_load1",
    // The shared fixup of the loads: status 1, rdx already holds the fault address.
    ".Lustrace_load_fault:",
    "    mov eax, 1",
    "    ret",
    ".popsection",
    // The exception table: (faulting insn, fixup), each a self-relative i32.
    ".pushsection .rodata.ustrace_extable,\"a\",@progbits",
    ".p2align 2",
    ".globl ustrace_extable_start",
    ".hidden ustrace_extable_start",
    "ustrace_extable_start:",
    "    .long .Lustrace_copy_word - .",
    "    .long .Lustrace_copy_fault - .",
    "    .long .Lustrace_copy_byte - .",
    "    .long .Lustrace_copy_fault - .",
    "    .long .Lustrace_str_byte - .",
    "    .long .Lustrace_str_fault - .",
    "    .long .Lustrace_load8 - .",
    "    .long .Lustrace_load_fault - .",
    "    .long .Lustrace_load4 - .",
    "    .long .Lustrace_load_fault - .",
    "    .long .Lustrace_load2 - .",
    "    .long .Lustrace_load_fault - .",
    "    .long .Lustrace_load1 - .",
    "    .long .Lustrace_load_fault - .",
    ".globl ustrace_extable_end",
    ".hidden ustrace_extable_end",
    "ustrace_extable_end:",
    ".popsection",
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn ustrace_uaccess_copy(dst: *mut u8, src: usize, len: usize) -> Ret2;
    fn ustrace_uaccess_copy_str(dst: *mut u8, src: usize, len: usize) -> Ret2;
    fn ustrace_uaccess_load8(addr: usize) -> Ret2;
    fn ustrace_uaccess_load4(addr: usize) -> Ret2;
    fn ustrace_uaccess_load2(addr: usize) -> Ret2;
    fn ustrace_uaccess_load1(addr: usize) -> Ret2;
    static ustrace_extable_start: u8;
    static ustrace_extable_end: u8;
}

#[cfg(not(target_arch = "x86_64"))]
compile_error!("ustrace-inspect uaccess: only x86_64 has the exception-table copy routine so far");

/// The fixup address for a faulting instruction at `rip`, if we own it.
fn search_extable(rip: usize) -> Option<usize> {
    // SAFETY: the two symbols delimit the table emitted above; each entry is
    // two aligned i32s holding offsets relative to their own addresses.
    unsafe {
        let mut p = &raw const ustrace_extable_start as *const i32;
        let end = &raw const ustrace_extable_end as *const i32;
        while p < end {
            let insn = (p as usize).wrapping_add(*p as isize as usize);
            let fixup_field = p.add(1);
            if insn == rip {
                return Some((fixup_field as usize).wrapping_add(*fixup_field as isize as usize));
            }
            p = p.add(2);
        }
    }
    None
}

static INSTALLED: AtomicBool = AtomicBool::new(false);
static INSTALL_LOCK: Mutex<()> = Mutex::new(());

/// How many displaced handlers are remembered per signal; one more displacement than
/// this forgets the newest but one (the first, the program's own, is always kept).
const GENERATIONS: usize = 8;

/// The handlers ours displaced, per signal (indexed like `SIGNALS`), oldest first: the
/// one in place at the first [`install`], then each that replaced ours later.
struct PrevActions(std::cell::UnsafeCell<[[libc::sigaction; GENERATIONS]; 2]>);
// SAFETY: an entry is written only under INSTALL_LOCK while ours is not the installed
// handler for that signal, and published by the Release store of PREV_COUNT that comes
// before ours is installed again; the signal handler reads entries below PREV_COUNT
// (Acquire). The one overwritten entry (the last, when all are used) is never below a
// count the handler can be using at that moment, as ours is not installed then.
unsafe impl Sync for PrevActions {}
// SAFETY: an all-zero sigaction is SIG_DFL with an empty mask.
static PREV: PrevActions = PrevActions(std::cell::UnsafeCell::new(unsafe { std::mem::zeroed() }));
/// How many entries of `PREV` are valid, per signal.
static PREV_COUNT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
const SIGNALS: [libc::c_int; 2] = [libc::SIGSEGV, libc::SIGBUS];

/// Faults being passed down the chain of displaced handlers: one slot per level, holding
/// the fault's `ucontext` address (0 = free). A handler that chains back to ours passes
/// the same context, so the number of slots holding it is how deep this fault already
/// went. Plain atomics: usable in a signal handler.
static CHAINING: [AtomicUsize; 32] = [const { AtomicUsize::new(0) }; 32];

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext for SA_SIGINFO
    // handlers; we only read and patch the saved registers.
    unsafe {
        let uc = &mut *(ctx as *mut libc::ucontext_t);
        let rip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize;
        if let Some(fixup) = search_extable(rip) {
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] = fixup as i64;
            uc.uc_mcontext.gregs[libc::REG_RDX as usize] = (*info).si_addr() as i64;
            return;
        }
        chain(sig, info, ctx);
    }
}

/// Hands a fault we do not own to the newest handler we displaced that has not seen it
/// yet (see the module docs), or to the default action.
///
/// # Safety
/// Only from `on_fault`, with the kernel-provided arguments.
unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let idx = if sig == libc::SIGBUS { 1 } else { 0 };
    let key = ctx as usize;
    let depth = CHAINING
        .iter()
        .filter(|s| s.load(Ordering::Relaxed) == key)
        .count();
    let count = PREV_COUNT[idx].load(Ordering::Acquire);
    let Some(level) = count.checked_sub(depth + 1) else {
        // SAFETY: as documented for this function.
        unsafe { default_action(sig, info) };
        return;
    };
    // SAFETY: entries below PREV_COUNT are written before they are published and not
    // written again while ours is installed (see PrevActions).
    let prev = unsafe { (*PREV.0.get())[idx][level] };
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: as documented for this function.
        unsafe { default_action(sig, info) };
        return;
    }
    // Mark this level taken for the time the handler runs; if no slot is free the guard
    // is skipped (a chain back to us would then start from the newest handler again).
    let slot = CHAINING.iter().find(|s| {
        s.compare_exchange(0, key, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    });
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous owner registered this as an SA_SIGINFO handler.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the previous owner registered this as a plain handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
    if let Some(slot) = slot {
        slot.store(0, Ordering::Relaxed);
    }
}

/// Restores the default action; returning re-executes the faulting instruction, which now
/// kills the process as if we were never here. A signal sent by kill() (si_code <= 0) does
/// not recur, so it is raised again; it stays pending until this handler returns.
///
/// # Safety
/// Only from the signal handler, with the kernel-provided `info`.
unsafe fn default_action(sig: libc::c_int, info: *mut libc::siginfo_t) {
    // SAFETY: sigaction and raise are async-signal-safe; info is valid.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        if (*info).si_code <= 0 {
            libc::raise(sig);
        }
    }
}

fn our_action() -> libc::sigaction {
    // SAFETY: zeroed sigaction is valid; we fill the fields we need.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_fault as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: sa_mask is a valid sigset_t to initialise.
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    sa
}

/// Installs the SIGSEGV/SIGBUS handler that makes reads fault-safe, or checks that it is
/// still the installed one.
///
/// Idempotent and cheap enough for control paths (two `sigaction` queries); called lazily
/// by the first read, and by ustrace each time a probe whose fetches may fault is
/// attached. If another handler replaced ours since, installs ours again in front of it,
/// chaining to it (see the module docs). Returns how many signals it had to reclaim.
pub fn install() -> std::io::Result<usize> {
    let _guard = INSTALL_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let ours = our_action();
    let mut reclaimed = 0;
    for (i, &sig) in SIGNALS.iter().enumerate() {
        // SAFETY: querying the current action into a local.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: valid signal number and out-pointer.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut cur) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if cur.sa_sigaction == ours.sa_sigaction {
            continue;
        }
        let count = PREV_COUNT[i].load(Ordering::Relaxed);
        let at = count.min(GENERATIONS - 1);
        // SAFETY: our handler is not registered for `sig` at this moment, so nothing
        // reads PREV[i] concurrently; the lock excludes other writers.
        unsafe { (*PREV.0.get())[i][at] = cur };
        PREV_COUNT[i].store(at + 1, Ordering::Release);
        // SAFETY: registering a valid action.
        if unsafe { libc::sigaction(sig, &ours, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if count > 0 {
            reclaimed += 1;
        }
    }
    INSTALLED.store(true, Ordering::Release);
    Ok(reclaimed)
}

#[inline]
fn ensure_installed() {
    if !INSTALLED.load(Ordering::Acquire) {
        // Installation can only fail for invalid signal numbers, which ours
        // are not; a failure would surface as a crash on the first bad read.
        let _ = install();
    }
}

/// Copies `buf.len()` bytes from `addr`; `Fault` if any of them is unreadable.
#[inline]
pub fn read(addr: usize, buf: &mut [u8]) -> Result<(), Fault> {
    ensure_installed();
    let len = buf.len();
    if addr.checked_add(len).is_none() {
        return Err(Fault {
            addr,
            len,
            bad: addr,
        });
    }
    // SAFETY: the routine writes at most `len` bytes to `buf` and any read
    // fault inside it is turned into a status by the exception table.
    let r = unsafe { ustrace_uaccess_copy(buf.as_mut_ptr(), addr, len) };
    if r.rax == 0 {
        Ok(())
    } else {
        Err(Fault {
            addr,
            len,
            bad: r.rdx as usize,
        })
    }
}

/// Copies a NUL-terminated string from `addr` into `buf`, stopping after the
/// NUL or when `buf` is full. Returns the string's length without the NUL
/// (`buf.len()` if no NUL was met), as the kernel's `strncpy_from_user`.
#[inline]
pub fn read_str(addr: usize, buf: &mut [u8]) -> Result<usize, Fault> {
    ensure_installed();
    let len = buf.len();
    // SAFETY: the routine writes at most `len` bytes to `buf`; faults are fixed up.
    let r = unsafe { ustrace_uaccess_copy_str(buf.as_mut_ptr(), addr, len) };
    if r.rax == u64::MAX {
        Err(Fault {
            addr,
            len,
            bad: r.rdx as usize,
        })
    } else {
        Ok(r.rax as usize)
    }
}

macro_rules! load_fn {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $asm:ident) => {
        $(#[$doc])*
        #[inline]
        pub fn $name(addr: usize) -> Result<$ty, Fault> {
            ensure_installed();
            // SAFETY: the routine only reads `addr`; a fault is fixed up.
            let r = unsafe { $asm(addr) };
            if r.rax == 0 {
                Ok(r.rdx as $ty)
            } else {
                Err(Fault { addr, len: std::mem::size_of::<$ty>(), bad: r.rdx as usize })
            }
        }
    };
}

load_fn!(
    /// Reads a native-endian u64 at `addr` (any alignment).
    read_u64, u64, ustrace_uaccess_load8
);
load_fn!(
    /// Reads a native-endian u32 at `addr` (any alignment).
    read_u32, u32, ustrace_uaccess_load4
);
load_fn!(
    /// Reads a native-endian u16 at `addr` (any alignment).
    read_u16, u16, ustrace_uaccess_load2
);
load_fn!(
    /// Reads one byte at `addr`.
    read_u8, u8, ustrace_uaccess_load1
);

/// Reads a pointer-sized value at `addr`.
#[inline]
pub fn read_usize(addr: usize) -> Result<usize, Fault> {
    read_u64(addr).map(|v| v as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_entries_point_into_the_routines() {
        let copy = ustrace_uaccess_copy as *const () as usize;
        // The first entry's instruction is the first word load, a few bytes in.
        // SAFETY: reading the first table entry.
        let first = unsafe {
            let p = &raw const ustrace_extable_start as *const i32;
            (p as usize).wrapping_add(*p as isize as usize)
        };
        assert!(first > copy && first < copy + 16, "{first:#x} vs {copy:#x}");
        assert!(search_extable(first).is_some());
        assert!(search_extable(copy).is_none());
    }

    #[test]
    fn reads_values_of_every_width() {
        let data: [u8; 9] = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        let a = data.as_ptr() as usize;
        assert_eq!(read_u8(a + 8), Ok(9));
        assert_eq!(read_u16(a + 1), Ok(u16::from_ne_bytes([2, 3])));
        assert_eq!(read_u32(a + 1), Ok(u32::from_ne_bytes([2, 3, 4, 5])));
        assert_eq!(
            read_u64(a + 1),
            Ok(u64::from_ne_bytes([2, 3, 4, 5, 6, 7, 8, 9]))
        );
        let mut out = [0u8; 9];
        read(a, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn wrapping_range_is_a_fault() {
        let mut b = [0u8; 16];
        assert!(read(usize::MAX - 4, &mut b).is_err());
    }
}
