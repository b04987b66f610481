//! ustrace-fprobe: the kernel's fprobe in user space — entry and exit handlers attached at run
//! time to any function of the process (Rust functions of the program, C functions of the
//! libraries it loaded), without recompiling, while other threads keep running — plus the
//! static keys (jump labels) that tracepoints sit behind.
//!
//! # Using it
//!
//! ```no_run
//! use ustrace_fprobe::{EntryAction, Fprobe};
//! let fp = Fprobe::builder()
//!     .entry_data_size(8)
//!     .entry_handler(|_fp, entry_ip, ret_ip, regs, data| {
//!         data.copy_from_slice(&regs.arg(0).unwrap_or(0).to_le_bytes());
//!         EntryAction::Continue // SkipExit cancels this call's exit handler
//!     })
//!     .exit_handler(|_fp, entry_ip, ret_ip, regs, data| {
//!         let _ret = regs.return_value();
//!     })
//!     .register("malloc* my_crate::*", Some("malloc_usable_size"))?; // or register_ips / register_syms
//! fp.disable();
//! fp.enable();
//! let _missed = fp.nmissed();
//! fp.unregister()?; // also on drop
//! # Ok::<(), ustrace_fprobe::Error>(())
//! ```
//!
//! # What happens to a probed function
//!
//! ```text
//!   before                         after registration
//!   ------                         ------------------
//!   func:  endbr64                 func:  endbr64                (kept)
//!          push rbp       -.              jmp entry_stub  ------> entry_stub: push r11; mov r11, &Site; jmp entry_trampoline
//!          mov rbp, rsp    |- 5+ bytes    <dead bytes>                 |
//!          sub rsp, 0x20  -'                                           v
//!          ...body...              resume: ...body...      entry_trampoline (shared, asm, CFI):
//!          ret                            ret                 save every register (16-byte aligned)
//!                                          |                   dispatch: lock-free walk of Site.probes,
//!                                          |                     entry handlers, maybe hook the return:
//!                                          |                     shadow.push{ret, sp}; [sp] = return_tramp
//!                                          |                   restore; jmp orig_stub (or, when
//!                                          |                     hooked, call it from just before
//!                                          |                     return_trampoline: see below)
//!                                          |               orig_stub: pop r11; push rbp; mov rbp,rsp; sub rsp,0x20
//!                                          |                          (relocated by iced-x86); jmp resume
//!                                          v
//!                                 return_trampoline (shared, asm, CFI):
//!                                   shadow.pop -> real ret written back into the slot,
//!                                   exit handlers (rax = return value), ret to the caller
//! ```
//!
//! A hooked call enters the body with a `call` whose return address is `return_trampoline`
//! itself, pushed into the slot the dispatcher had just set to that value, so the stack is
//! the same either way. What changes is the CPU's return-stack buffer: it now predicts the
//! body's `ret` into the trampoline and the trampoline's `ret` back to the caller. A hooked
//! return that jumped instead cost two mispredicted returns, about 11 ns of `fprobe_entry_exit`.
//!
//! Module map (the data path top to bottom):
//! - [`fprobe`](crate::Fprobe): the API of fprobe.rst, the registry of sites, `enabled_functions`.
//! - `dispatch`: the hit path — per-site probe lists published RCU-style, per-thread
//!   quiescence counters + `membarrier` for unregister, the per-thread shadow stack.
//! - `unwind`: hooks on libgcc's unwinder entry points (panics, C++ exceptions, pthread_exit,
//!   backtraces) and on `dlopen` (filters re-applied to new libraries).
//! - [`static_key`]: jump labels for tracepoints, patched by the same code.
//! - `arch/x86_64/`: everything that knows the instruction set — `text_poke` (the kernel's
//!   int3 protocol, batched into one write per run of neighbouring sites and step, + SIGTRAP
//!   routing + rendezvous), `insn` (prologue analysis/relocation),
//!   `entries` (other ways into a prologue: symbols and branches anywhere in the object),
//!   `trampoline` (asm, stub memory), `regs` ([`PtRegs`]). Other architectures get
//!   `arch/unsupported.rs`: registration returns [`Error::Unsupported`].
//!
//! # Guarantees (fprobe.rst) and how they hold
//!
//! - Handlers may run before `register*` returns; it returns only once every thread sees the
//!   patch (the int3 protocol serialises all cores with `membarrier(SYNC_CORE)`).
//! - After `unregister` returns neither handler of that fprobe runs again: it leaves every
//!   site list, its slot generation is bumped so pending exits no longer match it, and a grace
//!   period waits for every thread that was inside the dispatcher.
//! - Each exit handler call pairs with its entry on the same thread, through recursion and many
//!   threads: the pairing is the thread's own shadow stack, with `entry_data` stored in it.
//! - A probed function called from inside a handler (or a signal handler interrupting one) runs
//!   no handler and counts a miss (`nmissed`); a full shadow stack or `nr_maxactive` also
//!   counts a miss and skips that exit.
//! - Several fprobes on one function share one patch site; [`enabled_functions`] lists each
//!   patched function with its number of fprobes.
//!
//! # Limits
//!
//! - Hooking a return rewrites the return address; a hardware shadow stack (CET `shstk`)
//!   forbids that, so exit handlers are refused there.
//! - Panics, exceptions, `pthread_exit` and backtraces detach the outstanding hooked frames of
//!   their thread: exit handlers of those frames do not run (each counts a miss).
//! - Stacks that switch (coroutines, `sigaltstack` handlers reaching hooked returns of another
//!   stack) are not supported for exit handlers; a return that finds no shadow frame aborts
//!   with a message rather than jumping to a wrong address.
//! - `xmm0`-`xmm7` are preserved; the upper halves of `ymm`/`zmm` registers are not if a
//!   handler uses AVX (no x86_64 SysV function takes arguments there unless it uses
//!   `__m256`/`__m512` parameters).
//! - The rendezvous that makes patching safe for threads preempted inside a prologue uses the
//!   real-time signal `SIGRTMAX-5` and may make an interrupted `poll`/`epoll_wait` return
//!   `EINTR` once.
//!   A thread that cannot answer it at once (stopped by SIGSTOP or a debugger, asleep) runs
//!   it before its next user instruction; a debugger that discards that signal for a thread
//!   stopped inside a prologue being patched leaves the thread in the new bytes.
//! - Indirect branches (jump tables) are not checked for targets inside the patched bytes;
//!   direct branches from anywhere in the function's object and other symbols starting inside
//!   them are (glibc's `mempcpy` jumps to `memcpy+3`: such a `memcpy` is refused).
//! - A thread that has SIGTRAP blocked and runs into a function while its patch is in flight
//!   (between the int3 and the last byte) is killed by the kernel: an int3 trap cannot be held
//!   back. glibc starts and ends threads with every signal blocked; the functions it runs
//!   there, and entry points that are not C functions (lazy-binding and TLS-descriptor
//!   resolvers, `setjmp`-like returns-twice functions when the return is hooked), are refused
//!   by name, as the kernel marks its own `notrace`.
//! - A thread that was interrupted inside a prologue by a signal whose handler is still
//!   running while that prologue is patched resumes in the new bytes when the handler returns
//!   (the rendezvous sees the handler's `rip`, not the saved one). Patch outside such windows.
//! - `dlopen`: filter fprobes are re-applied after the call returns; functions the library's
//!   constructors call during the load are not probed yet.
//! - Per thread: [`MAX_FRAMES`] hooked calls outstanding and [`ARENA_WORDS`] words of entry
//!   data, in the thread's static TLS (so no allocation on the hot path).

#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

pub mod static_key;

#[doc(hidden)]
pub mod bench;

mod arch;
mod dispatch;
mod fprobe;
mod unwind;

pub use arch::PtRegs;
pub use dispatch::{
    outstanding_frames, EntryAction, EntryHandler, ExitHandler, Probe, ARENA_WORDS, MAX_FRAMES,
};
pub use fprobe::{
    check_patchable, enabled_functions, rescan_filters, Fprobe, FprobeBuilder, Refusal,
};
pub use unwind::{
    dlopen_hook_status, unwind_hook_status, DLOPEN_ENTRY_POINTS, UNWIND_ENTRY_POINTS,
};

/// Text of tracefs `available_filter_functions` (every function of every loaded object; see
/// `ustrace_inspect::symbols::Inventory::available_filter_functions`).
pub fn available_filter_functions() -> String {
    ustrace_inspect::symbols::inventory().available_filter_functions()
}

/// Counters of the patching machinery.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes of trampoline/stub memory in use (never freed).
    pub code_bytes: usize,
    /// Threads the patch rendezvous found parked inside a prologue and moved.
    pub moved_threads: u32,
}

/// Current [`Stats`].
pub fn stats() -> Stats {
    Stats {
        code_bytes: arch::code_bytes(),
        moved_threads: arch::moved_threads(),
    }
}

/// Errors of registration and patching.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// This platform or process cannot be patched (other architecture, no membarrier, ...).
    Unsupported(String),
    /// Writing code failed.
    Patch(String),
    /// The trap table is full.
    TooManySites,
    /// More live fprobes than probe slots.
    TooManyProbes,
    /// No function matched the filter or name.
    NoMatch(String),
    /// A function cannot be patched safely (the reason says why).
    Refused(String),
    /// The call is not allowed here.
    Invalid(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Unsupported(why) => write!(f, "unsupported: {why}"),
            Error::Patch(why) => write!(f, "patch failed: {why}"),
            Error::TooManySites => write!(f, "too many patch sites (trap table full)"),
            Error::TooManyProbes => {
                write!(f, "too many live fprobes ({} slots)", dispatch::PROBE_SLOTS)
            }
            Error::NoMatch(what) => write!(f, "no function matches {what:?}"),
            Error::Refused(why) => write!(f, "function cannot be probed: {why}"),
            Error::Invalid(why) => write!(f, "invalid: {why}"),
        }
    }
}

impl std::error::Error for Error {}
