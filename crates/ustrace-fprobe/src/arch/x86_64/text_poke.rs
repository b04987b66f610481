//! Cross-modifying code while other threads run: the kernel's `text_poke_bp` protocol in user space.
//!
//! Every change to executable bytes in this crate (fprobe jumps, static-key branches) goes through
//! [`poke_batch`]. One batch patches any number of sites with one set of serialisations:
//!
//! ```text
//!   site bytes      step                                    who may execute the site meanwhile
//!   ------------    -------------------------------------   -----------------------------------
//!   o0 o1 o2 o3 o4  1. publish trap route, write int3        old code, or int3 -> SIGTRAP handler
//!   CC o1 o2 o3 o4  2. membarrier(SYNC_CORE)                 every core now sees the int3
//!   CC o1 o2 o3 o4  3. rendezvous (only for multi-insn        threads parked *inside* the old bytes
//!                      replacements): signal every thread,   are moved to the relocated copy
//!                      move any thread found mid-prologue
//!   CC n1 n2 n3 n4  4. write the tail, membarrier(SYNC_CORE)  int3 still guards the site
//!   n0 n1 n2 n3 n4  5. write the first byte, membarrier      new code; a late int3 fetch still traps
//!                   6. publish the final trap route          and is routed to the new target
//! ```
//!
//! The SIGTRAP handler looks the trapping address up in a lock-free open-addressing table
//! ([`TrapTable`]) whose entries are never removed, so a thread that fetched the int3 just before
//! step 5 (or is being delivered the signal late) is still sent to the right place. Only a
//! breakpoint trap (`si_code` `SI_KERNEL`/`TRAP_BRKPT`) is looked up; traps on addresses that are
//! not ours and SIGTRAPs sent by `kill`/`tgkill` are handed to the previously installed handler,
//! or get the default action (an int3 is re-executed under it, a sent signal is raised again).
//!
//! Bytes are written through `/proc/self/mem`, which the kernel lets a process use to write its own
//! read-only text without changing page protections (no W+X window, no `mprotect` races between
//! two patches of one page). A batch reads the text under its sites once, in spans of sites on
//! the same or adjacent pages, and writes each span whole in each step (the bytes between
//! sites with the values they hold): a few system calls per step for thousands of sites. The
//! reads, writes and membarriers are `syscall` instructions of this module, not libc calls,
//! so the patcher never runs through a function it has just armed.
//!
//! The rendezvous (step 3) exists because a multi-instruction prologue replaced by one `jmp rel32`
//! leaves instruction boundaries inside the new bytes: a thread that was preempted between two
//! prologue instructions would resume in the middle of the `jmp`. Each thread is sent a real-time
//! signal; its handler inspects the interrupted `rip` and, if it lies strictly inside a patched
//! range, rewrites it to the matching instruction of the relocated prologue (which ends with a jump
//! back past the patched range). The moves live in a table that stays published for as long as
//! the patch is in place, not only for the round. A thread that does not answer in time is
//! accepted when it is not running and does not block the signal (stopped by SIGSTOP or a
//! debugger, asleep, waiting on a page fault: the kernel runs the handler before its next user
//! instruction, wherever its `rip` is), or when it blocks the signal but sleeps in a system call
//! (its `rip` then sits after a `syscall`, which no relocatable prologue contains); otherwise the
//! batch is rolled back after 2 s. A debugger that swallows the signal defeats this.

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::Error;

/// Serialises every text modification in the process (the kernel's `text_mutex`).
static TEXT_MUTEX: Mutex<()> = Mutex::new(());

/// Takes the text mutex; poisoning is ignored because a panic while holding it leaves no
/// half-written code (every step is re-done from the table on the next batch).
pub(crate) fn text_lock() -> MutexGuard<'static, ()> {
    TEXT_MUTEX.lock().unwrap_or_else(|e| e.into_inner())
}

const TRAP_SLOTS: usize = 1 << 16;

/// Lock-free open-addressing map from a code address to another code address. Written only
/// under the text mutex; read from signal handlers. Keys are never removed (a value may be
/// set to 0, "none"), so a reader never sees a slot change meaning under it.
struct AddrMap {
    keys: [AtomicUsize; TRAP_SLOTS],
    vals: [AtomicUsize; TRAP_SLOTS],
    count: AtomicUsize,
}

impl AddrMap {
    const fn new() -> Self {
        AddrMap {
            keys: [const { AtomicUsize::new(0) }; TRAP_SLOTS],
            vals: [const { AtomicUsize::new(0) }; TRAP_SLOTS],
            count: AtomicUsize::new(0),
        }
    }

    /// Publishes `val` for `addr`. Caller holds the text mutex.
    fn set(&self, addr: usize, val: usize) -> Result<(), Error> {
        let mut i = trap_hash(addr);
        for _ in 0..TRAP_SLOTS {
            let key = self.keys[i].load(Ordering::Acquire);
            if key == addr {
                self.vals[i].store(val, Ordering::Release);
                return Ok(());
            }
            if key == 0 {
                if self.count.load(Ordering::Relaxed) >= TRAP_SLOTS * 3 / 4 {
                    return Err(Error::TooManySites);
                }
                // Value first, key second: a reader that sees the key sees a valid value.
                self.vals[i].store(val, Ordering::Release);
                self.keys[i].store(addr, Ordering::Release);
                self.count.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            i = (i + 1) & (TRAP_SLOTS - 1);
        }
        Err(Error::TooManySites)
    }

    /// Async-signal-safe lookup; `None` for unknown or withdrawn addresses. Inlined into the
    /// int3 handler and calling no generic helper, so that a tracer patching functions of the
    /// standard library does not put an int3 in the code that resolves int3s.
    #[inline(always)]
    fn get(&self, addr: usize) -> Option<usize> {
        let mut i = trap_hash(addr);
        // A counted `while`, not a range iterator: no call into the standard library.
        let mut left = TRAP_SLOTS;
        while left > 0 {
            let key = self.keys[i].load(Ordering::Acquire);
            if key == addr {
                let v = self.vals[i].load(Ordering::Acquire);
                return if v != 0 { Some(v) } else { None };
            }
            if key == 0 {
                return None;
            }
            i = (i + 1) & (TRAP_SLOTS - 1);
            left -= 1;
        }
        None
    }
}

/// Where a thread that traps on the int3 at an address must resume.
static TRAPS: AddrMap = AddrMap::new();

/// For every instruction boundary strictly inside bytes that are (or are being) replaced by a
/// `jmp`: the equivalent instruction of the relocated copy. Published before the rendezvous
/// and withdrawn only once the original bytes are back, so a thread that runs its rendezvous
/// handler late (stopped, or asleep in the kernel, when it was asked) is still moved.
static MOVES: AddrMap = AddrMap::new();

#[inline(always)]
fn trap_hash(addr: usize) -> usize {
    (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) & (TRAP_SLOTS - 1)
}

fn trap_set(addr: usize, resume: usize) -> Result<(), Error> {
    TRAPS.set(addr, resume)
}

#[inline(always)]
fn trap_get(addr: usize) -> Option<usize> {
    TRAPS.get(addr)
}

/// One replacement of the bytes at `addr`.
pub(crate) struct Poke {
    pub addr: usize,
    /// New bytes, 1..=15 of them.
    pub new: Vec<u8>,
    /// Where a thread that hits the int3 goes while the batch is in flight (it must behave like
    /// either the old or the new code).
    pub trap_resume: usize,
    /// Where a late trap goes once the new bytes are in place (behaves like the new code).
    pub final_resume: usize,
    /// For multi-instruction replacements: (old instruction address, equivalent address in the
    /// relocated copy) for every instruction boundary strictly inside `addr..addr+new.len()`.
    pub interior: Vec<(usize, usize)>,
    /// When the batch puts original bytes back: the interior boundaries whose moves to
    /// withdraw once they are valid instructions again.
    pub restores: Vec<usize>,
}

fn proc_mem() -> Result<&'static File, Error> {
    static MEM: OnceLock<Result<File, String>> = OnceLock::new();
    MEM.get_or_init(|| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| Error::Unsupported(format!("cannot open /proc/self/mem for text writes: {e}")))
}

/// A system call made with the `syscall` instruction itself, not through libc. The patcher
/// reads and writes code, and serialises cores, between arming a batch's int3s and removing
/// them, and libc's `pread`/`pwrite`/`syscall` may be among the functions being patched: through
/// them every step would trap into its own emulation (or, once they are patched, run the
/// tracer's handlers for the patcher's own writes). Returns the kernel's result: a count, or
/// `-errno`.
fn raw_syscall4(nr: libc::c_long, a1: usize, a2: usize, a3: usize, a4: usize) -> isize {
    let ret: isize;
    // SAFETY: the callers pass the arguments their system call documents (valid buffers of
    // the given lengths); `syscall` clobbers rcx and r11 only, and touches no stack.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a1,
            in("rsi") a2,
            in("rdx") a3,
            in("r10") a4,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// The calling thread's id, by [`raw_syscall4`]: the dispatcher asks for it on a thread's
/// first hit, and the patcher while libc's `syscall()` may be armed or probed.
pub(crate) fn gettid() -> i32 {
    raw_syscall4(libc::SYS_gettid, 0, 0, 0, 0) as i32
}

/// `pread64`/`pwrite64` of all of `len` bytes at `addr` of /proc/self/mem.
fn mem_rw(write: bool, addr: usize, buf: *mut u8, len: usize) -> Result<(), std::io::Error> {
    use std::os::fd::AsRawFd;
    let fd = proc_mem()
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .as_raw_fd() as usize;
    let nr = if write {
        libc::SYS_pwrite64
    } else {
        libc::SYS_pread64
    };
    let mut done = 0;
    while done < len {
        let r = raw_syscall4(nr, fd, buf as usize + done, len - done, addr + done);
        match r {
            n if n > 0 => done += n as usize,
            0 => return Err(std::io::Error::from_raw_os_error(libc::EIO)),
            e if e == -(libc::EINTR as isize) => {}
            e => return Err(std::io::Error::from_raw_os_error(-e as i32)),
        }
    }
    Ok(())
}

/// Writes code bytes; the caller guarantees no thread can execute `addr..addr+bytes.len()` in a
/// way that observes a partial write (int3 guard or single byte, or bytes written with the
/// values they already hold).
pub(crate) fn write_text(addr: usize, bytes: &[u8]) -> Result<(), Error> {
    mem_rw(true, addr, bytes.as_ptr().cast_mut(), bytes.len())
        .map_err(|e| Error::Patch(format!("writing {} bytes at {addr:#x}: {e}", bytes.len())))
}

/// Reads current code bytes (through /proc/self/mem so unmapped addresses give an error, not a
/// fault).
pub(crate) fn read_text(addr: usize, out: &mut [u8]) -> Result<(), Error> {
    mem_rw(false, addr, out.as_mut_ptr(), out.len())
        .map_err(|e| Error::Patch(format!("reading {} bytes at {addr:#x}: {e}", out.len())))
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 8;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 16;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 32;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 64;

/// `membarrier(cmd, 0, 0)`: 0 or `-errno` (a raw call, as [`raw_syscall4`] says why).
fn membarrier(cmd: libc::c_long) -> isize {
    raw_syscall4(libc::SYS_membarrier, cmd as usize, 0, 0, 0)
}

/// Registers the process for both expedited membarrier flavours, once.
pub(crate) fn membarrier_init() -> Result<(), Error> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let r = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE);
        if r != 0 {
            return Err(format!(
                "membarrier(REGISTER_PRIVATE_EXPEDITED_SYNC_CORE): {}",
                std::io::Error::from_raw_os_error(-r as i32)
            ));
        }
        let r = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
        if r != 0 {
            return Err(format!(
                "membarrier(REGISTER_PRIVATE_EXPEDITED): {}",
                std::io::Error::from_raw_os_error(-r as i32)
            ));
        }
        Ok(())
    })
    .clone()
    .map_err(Error::Unsupported)
}

/// Every thread of the process executes a core-serialising instruction before this returns.
fn sync_core() {
    let r = membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE);
    assert_eq!(r, 0, "membarrier sync_core failed after registration");
    // The calling thread serialises itself too.
    // SAFETY: cpuid has no memory effects; rbx is saved because LLVM reserves it.
    unsafe {
        std::arch::asm!("push rbx", "xor eax, eax", "cpuid", "pop rbx", out("eax") _, out("ecx") _, out("edx") _);
    }
}

/// Full memory barrier on every running thread of the process (the writer side of the
/// asymmetric-fence quiescence scheme in `dispatch`).
pub(crate) fn membarrier_all() {
    let r = membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
    assert_eq!(
        r, 0,
        "membarrier private_expedited failed after registration"
    );
}

// ---------------------------------------------------------------------------------------------
// SIGTRAP routing

static OLD_SIGTRAP: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static TRAP_INSTALLED: AtomicBool = AtomicBool::new(false);

/// `si_code` of the SIGTRAP an `int3` raises on x86_64 (the kernel's `do_int3_user`).
const SI_KERNEL: libc::c_int = 0x80;
/// `si_code` of a breakpoint trap as other paths report it.
const TRAP_BRKPT: libc::c_int = 1;

extern "C" fn on_sigtrap(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    let uc = uctx.cast::<libc::ucontext_t>();
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler.
    let (rip, code) = unsafe {
        (
            (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as usize,
            (*info).si_code,
        )
    };
    // Only a breakpoint trap has executed an int3, whose address is rip-1. A SIGTRAP sent
    // with kill/tgkill/sigqueue (si_code <= 0) or a single-step trap leaves rip on an
    // instruction boundary that may even follow one of our sites: never treat it as ours.
    let int3 = code == SI_KERNEL || code == TRAP_BRKPT;
    if int3 {
        if let Some(resume) = trap_get(rip.wrapping_sub(1)) {
            // SAFETY: as above; rewriting rip is how a handler redirects the interrupted thread.
            unsafe { (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] = resume as i64 };
            return;
        }
    }
    let old = OLD_SIGTRAP.load(Ordering::Acquire);
    if !old.is_null() {
        // SAFETY: `old` was filled by sigaction and is never freed.
        let old = unsafe { &*old };
        let h = old.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN {
            if old.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with SA_SIGINFO, so it takes this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(h) };
                f(sig, info, uctx);
            } else {
                // SAFETY: a plain handler takes only the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
            return;
        }
        if h == libc::SIG_IGN {
            return;
        }
    }
    // Not ours and no handler: the default action (terminate with a core dump), as if we had
    // never been installed.
    // SAFETY: resetting a disposition and raising are async-signal-safe; for an int3, rip-1
    // is the int3 that trapped and running it again under SIG_DFL takes the default action.
    unsafe {
        libc::signal(libc::SIGTRAP, libc::SIG_DFL);
        if int3 {
            (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] = (rip - 1) as i64;
        } else {
            // A sent signal does not recur by itself; SA_NODEFER leaves SIGTRAP unblocked,
            // so this one is delivered (under SIG_DFL) as raise returns.
            libc::raise(libc::SIGTRAP);
        }
    }
}

fn install_handlers() -> Result<(), Error> {
    if TRAP_INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: sigaction with a zeroed struct filled field by field is the documented use; the
    // old action is leaked on purpose so the handler may read it forever.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigtrap as *const () as usize;
        // Not SA_ONSTACK: an int3 trap is ordinary code on a healthy stack, and the handlers
        // nest (a trap inside the rendezvous handler, or a rendezvous inside a trap while
        // thousands of functions are patched at once); on the small alternate stack the Rust
        // runtime gives each thread they would overflow it.
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        let old = Box::into_raw(Box::new(std::mem::zeroed::<libc::sigaction>()));
        if libc::sigaction(libc::SIGTRAP, &sa, old) != 0 {
            return Err(Error::Unsupported(format!(
                "sigaction(SIGTRAP): {}",
                std::io::Error::last_os_error()
            )));
        }
        OLD_SIGTRAP.store(old, Ordering::Release);

        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_rendezvous as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(rendezvous_signal(), &sa, std::ptr::null_mut()) != 0 {
            return Err(Error::Unsupported(format!(
                "sigaction(SIGRTMAX-5): {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    TRAP_INSTALLED.store(true, Ordering::Release);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Rendezvous: make sure no thread sits inside a range that is about to become a `jmp`.

/// The real-time signal used for the rendezvous (SIGRTMAX-5, documented in the crate docs).
pub(crate) fn rendezvous_signal() -> libc::c_int {
    libc::SIGRTMAX() - 5
}

struct RendezvousPlan {
    /// Thread ids asked to answer, and whether each has answered.
    tids: Vec<(AtomicI32, AtomicBool)>,
}

static PLAN: AtomicPtr<RendezvousPlan> = AtomicPtr::new(std::ptr::null_mut());
/// Rendezvous handlers between their load of `PLAN` and their last use of it.
static IN_RENDEZVOUS: AtomicUsize = AtomicUsize::new(0);
static MOVED_THREADS: AtomicU32 = AtomicU32::new(0);

/// Number of threads the rendezvous found parked inside a prologue and moved (for tests/stats).
pub(crate) fn moved_threads() -> u32 {
    MOVED_THREADS.load(Ordering::Relaxed)
}

extern "C" fn on_rendezvous(
    _sig: libc::c_int,
    _info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) {
    IN_RENDEZVOUS.fetch_add(1, Ordering::SeqCst);
    // The plan is loaded before MOVES is read: the moves of the round that published this plan
    // were published before it, so a late handler of an earlier round that answers this
    // round has also been moved by this round's moves.
    let plan = PLAN.load(Ordering::SeqCst);
    let uc = uctx.cast::<libc::ucontext_t>();
    // SAFETY: valid ucontext from the kernel.
    let rip = unsafe { (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] } as usize;
    if let Some(to) = MOVES.get(rip) {
        // SAFETY: redirecting the interrupted thread to the equivalent relocated instruction.
        unsafe { (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] = to as i64 };
        MOVED_THREADS.fetch_add(1, Ordering::Relaxed);
    }
    if !plan.is_null() {
        // SAFETY: the owner frees a plan only after unpublishing it and seeing IN_RENDEZVOUS
        // at zero, which cannot happen while this handler is between its increment and
        // decrement (both SeqCst, as is the owner's store and load).
        let plan = unsafe { &*plan };
        let me = gettid();
        for (tid, answered) in &plan.tids {
            if tid.load(Ordering::Relaxed) == me {
                answered.store(true, Ordering::Release);
            }
        }
    }
    IN_RENDEZVOUS.fetch_sub(1, Ordering::SeqCst);
}

fn list_threads() -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            if let Some(t) = e.file_name().to_str().and_then(|s| s.parse().ok()) {
                out.push(t);
            }
        }
    }
    out
}

/// Whether a thread that has not answered the rendezvous can be left to answer later: when
/// it next runs user code it must not execute the new bytes from an old instruction boundary.
///
/// A thread that is not running (asleep `S`, in uninterruptible wait `D`, stopped `T`/`t`)
/// has the rendezvous signal pending; unless it blocks that signal, the kernel delivers it
/// before the thread executes another user instruction, and the handler then finds its move
/// in `MOVES`, which stays published while the patch is in place. Its rip may well be inside
/// a prologue: a thread stopped by SIGSTOP or a debugger, or waiting on a page fault there.
/// A thread that blocks the signal is accepted only while asleep (`S`) in a system call, where
/// its rip is after a `syscall` instruction, which no relocated prologue contains. A running
/// thread (`R`) is waited for.
fn silent_thread_is_safe(tid: i32) -> bool {
    let state = match std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) {
        Err(_) => return true, // exited
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next()),
    };
    match state {
        Some('Z' | 'X') => true,
        Some('S' | 'D' | 'T' | 't' | 'I' | 'P' | 'W' | 'K') => {
            if !signal_blocked(tid, rendezvous_signal()) {
                return true;
            }
            state == Some('S')
        }
        _ => false,
    }
}

/// Whether `sig` is in the blocked mask of thread `tid` (unknown counts as blocked).
fn signal_blocked(tid: i32, sig: libc::c_int) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")) else {
        return true;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_none_or(|mask| mask & (1u64 << (sig - 1)) != 0)
}

/// Asks every other thread to run the rendezvous handler, which moves a thread found at one
/// of the published interior boundaries (`MOVES`) to its relocated copy.
fn rendezvous() -> Result<(), Error> {
    // SAFETY: getpid takes no arguments.
    let (me, pid) = (gettid(), unsafe { libc::getpid() });
    let tids: Vec<i32> = list_threads().into_iter().filter(|&t| t != me).collect();
    let plan = Box::new(RendezvousPlan {
        tids: tids
            .iter()
            .map(|&t| (AtomicI32::new(t), AtomicBool::new(false)))
            .collect(),
    });
    let plan_ptr = Box::into_raw(plan);
    PLAN.store(plan_ptr, Ordering::SeqCst);
    // SAFETY: plan_ptr is live until we free it below.
    let plan = unsafe { &*plan_ptr };
    for (tid, answered) in &plan.tids {
        // SAFETY: tgkill with our own pid and a thread id read from /proc.
        let r = unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                pid,
                tid.load(Ordering::Relaxed),
                rendezvous_signal(),
            )
        };
        if r != 0 {
            answered.store(true, Ordering::Release); // ESRCH: the thread is gone
        }
    }
    let start = Instant::now();
    let mut result = Ok(());
    loop {
        let pending: Vec<i32> = plan
            .tids
            .iter()
            .filter(|(_, a)| !a.load(Ordering::Acquire))
            .map(|(t, _)| t.load(Ordering::Relaxed))
            .collect();
        if pending.is_empty() {
            break;
        }
        let waited = start.elapsed();
        if waited > Duration::from_millis(50) && pending.iter().all(|&t| silent_thread_is_safe(t)) {
            // Each silent thread runs the handler before its next user instruction (or sits
            // after a syscall); the moves stay published for it. See silent_thread_is_safe.
            break;
        }
        if waited > Duration::from_secs(2) {
            result = Err(Error::Patch(format!(
                "threads {pending:?} did not answer the patch rendezvous (signal {} blocked while running?)",
                rendezvous_signal()
            )));
            break;
        }
        std::thread::yield_now();
    }
    // Unpublish, then free once no handler can still hold the pointer. A handler that stays
    // inside (its thread stopped mid-handler) makes us leak the plan instead: it is small.
    PLAN.store(std::ptr::null_mut(), Ordering::SeqCst);
    let freeing = Instant::now();
    while IN_RENDEZVOUS.load(Ordering::SeqCst) != 0 {
        if freeing.elapsed() > Duration::from_millis(100) {
            return result;
        }
        std::thread::yield_now();
    }
    // SAFETY: unpublished, and no handler is between loading it and its last use.
    drop(unsafe { Box::from_raw(plan_ptr) });
    result
}

const PAGE: usize = 4096;

/// Groups the byte ranges of a batch's pokes (sorted, not overlapping) into spans that are
/// each read once and written whole in every step of the protocol: one `/proc/self/mem`
/// write per span and step instead of one per site (each write costs a system call and a
/// page-table walk; thousands of functions are patched at once). A range joins the span
/// before it when it starts on the page where that span ends or on the next one, so every
/// page a span covers holds part of a poke: it is mapped, and written anyway.
fn plan_spans(ranges: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for &(start, end) in ranges {
        match spans.last_mut() {
            Some(last) if start / PAGE <= (last.1 - 1) / PAGE + 1 => last.1 = last.1.max(end),
            _ => spans.push((start, end)),
        }
    }
    spans
}

/// The current text under a batch's spans, modified step by step and written back whole.
/// Bytes between pokes are written with the values just read from them: the text mutex is
/// held, so no other writer changes them meanwhile, and a thread executing them fetches the
/// same bytes before and after.
struct Spans {
    spans: Vec<(usize, Vec<u8>)>,
    /// For every poke (in the caller's order): its span and offset in it.
    at: Vec<(usize, usize)>,
}

impl Spans {
    fn read(pokes: &[Poke]) -> Result<Spans, Error> {
        let mut order: Vec<usize> = (0..pokes.len()).collect();
        order.sort_unstable_by_key(|&i| pokes[i].addr);
        let ranges: Vec<(usize, usize)> = order
            .iter()
            .map(|&i| (pokes[i].addr, pokes[i].addr + pokes[i].new.len()))
            .collect();
        if let Some(w) = ranges.windows(2).find(|w| w[0].1 > w[1].0) {
            return Err(Error::Patch(format!(
                "two changes of one batch overlap at {:#x} and {:#x}",
                w[0].0, w[1].0
            )));
        }
        let mut spans = Vec::new();
        for (start, end) in plan_spans(&ranges) {
            let mut buf = vec![0u8; end - start];
            read_text(start, &mut buf)?;
            spans.push((start, buf));
        }
        let mut at = vec![(0, 0); pokes.len()];
        let mut s = 0;
        for &i in &order {
            let addr = pokes[i].addr;
            while addr >= spans[s].0 + spans[s].1.len() {
                s += 1;
            }
            at[i] = (s, addr - spans[s].0);
        }
        Ok(Spans { spans, at })
    }

    /// Sets the bytes of poke `i` from `from` on to `bytes`.
    fn set(&mut self, i: usize, from: usize, bytes: &[u8]) {
        let (s, off) = self.at[i];
        self.spans[s].1[off + from..off + from + bytes.len()].copy_from_slice(bytes);
    }

    fn byte(&self, i: usize) -> u8 {
        let (s, off) = self.at[i];
        self.spans[s].1[off]
    }

    /// Writes the first `n` spans (all with `usize::MAX`); on error, how many were written
    /// whole before the one that failed.
    fn write(&self, n: usize) -> Result<(), (usize, Error)> {
        for (k, (start, buf)) in self.spans.iter().take(n).enumerate() {
            write_text(*start, buf).map_err(|e| (k, e))?;
        }
        Ok(())
    }
}

/// Applies a batch of pokes with the int3 protocol. Caller holds [`text_lock`].
pub(crate) fn poke_batch(pokes: &[Poke], _guard: &MutexGuard<'static, ()>) -> Result<(), Error> {
    if pokes.is_empty() {
        return Ok(());
    }
    membarrier_init()?;
    install_handlers()?;
    for p in pokes {
        assert!(
            !p.new.is_empty() && p.new.len() <= 15,
            "poke length {}",
            p.new.len()
        );
    }
    let mut text = Spans::read(pokes)?;
    let olds: Vec<u8> = (0..pokes.len()).map(|i| text.byte(i)).collect();
    for p in pokes {
        trap_set(p.addr, p.trap_resume)?;
    }
    let moves: Vec<(usize, usize)> = pokes
        .iter()
        .flat_map(|p| p.interior.iter().copied())
        .collect();
    // Step 1: int3 on every site.
    for i in 0..pokes.len() {
        text.set(i, 0, &[0xCC]);
    }
    let mut err = text.write(usize::MAX).err();
    sync_core();
    if err.is_none() && !moves.is_empty() {
        // Published before any thread is asked, kept for as long as the jmp is in place.
        for &(old, new) in &moves {
            if let Err(e) = MOVES.set(old, new) {
                err = Some((usize::MAX, e));
                break;
            }
        }
        if err.is_none() {
            if let Err(e) = rendezvous() {
                err = Some((usize::MAX, e));
            }
        }
    }
    if let Some((written, e)) = err {
        for (i, old) in olds.iter().enumerate() {
            text.set(i, 0, &[*old]);
        }
        // The span whose write failed may have been written in part: it is rewritten too.
        let _ = text.write(written.saturating_add(1));
        sync_core();
        // The old bytes are back: their boundaries are valid again (a thread still moved
        // there later would run the equivalent relocated copy, which is harmless too).
        for &(old, _) in &moves {
            let _ = MOVES.set(old, 0);
        }
        return Err(e);
    }
    // Step 4: the tails.
    for (i, p) in pokes.iter().enumerate() {
        text.set(i, 1, &p.new[1..]);
    }
    if pokes.iter().any(|p| p.new.len() > 1) {
        text.write(usize::MAX).map_err(|(_, e)| e)?;
        sync_core();
    }
    // Step 5: the first bytes.
    for (i, p) in pokes.iter().enumerate() {
        text.set(i, 0, &p.new[..1]);
    }
    text.write(usize::MAX).map_err(|(_, e)| e)?;
    sync_core();
    for p in pokes {
        trap_set(p.addr, p.final_resume)?;
        // Original bytes are whole again: a thread that resumes at one of these boundaries
        // now runs them as they are.
        for &old in &p.restores {
            MOVES.set(old, 0)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_join_ranges_on_the_same_or_the_next_page_only() {
        let r = [
            (0x1000, 0x1005),
            (0x1010, 0x1015),
            (0x1ffe, 0x2003),
            (0x2ff0, 0x2ff5),
            (0x4000, 0x4005),
            (0x6000, 0x6005),
        ];
        assert_eq!(
            plan_spans(&r),
            vec![(0x1000, 0x2ff5), (0x4000, 0x4005), (0x6000, 0x6005)]
        );
        assert_eq!(plan_spans(&[]), Vec::<(usize, usize)>::new());
    }

    fn poke(addr: usize, new: &[u8]) -> Poke {
        Poke {
            addr,
            new: new.to_vec(),
            trap_resume: 0,
            final_resume: 0,
            interior: Vec::new(),
            restores: Vec::new(),
        }
    }

    #[test]
    fn each_poke_finds_its_bytes_in_the_spans_read() {
        // Readable memory of our own (read through /proc/self/mem as text is).
        let mem: &'static mut [u8] = Box::leak(vec![0u8; 3 * PAGE].into_boxed_slice());
        for (i, b) in mem.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let base = mem.as_ptr() as usize;
        // Out of order on purpose: `at` follows the caller's order.
        let pokes = [
            poke(base + 2 * PAGE + 7, &[1, 2, 3, 4, 5]),
            poke(base + 3, &[9]),
            poke(base + 10, &[8, 8]),
        ];
        let mut text = Spans::read(&pokes).unwrap();
        for (i, p) in pokes.iter().enumerate() {
            assert_eq!(text.byte(i), mem[p.addr - base], "poke {i}");
        }
        text.set(0, 1, &[2, 3, 4, 5]);
        let (s, off) = text.at[0];
        assert_eq!(&text.spans[s].1[off + 1..off + 5], &[2, 3, 4, 5]);
        let overlapping = [poke(base + 3, &[1, 2]), poke(base + 4, &[1])];
        assert!(Spans::read(&overlapping).is_err());
    }
}
