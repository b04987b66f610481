//! Restartable sequences: how a writer updates its own CPU's buffer with
//! plain loads and stores instead of locked read-modify-write instructions.
//!
//! On this kind of machine a locked `cmpxchg16b` or `lock xadd` costs 5–11 ns
//! each, and a write needs two of them (reserve and commit). The kernel
//! avoids them because a CPU buffer is only ever written by its own CPU with
//! preemption off. A user-space thread cannot turn preemption off, but a
//! restartable sequence (rseq(2)) gets the same effect: a short stretch of
//! code that the kernel *restarts* (jumps to an abort handler) whenever the
//! thread is preempted, migrated or interrupted by a signal before the
//! stretch's last instruction — the single store that commits it — retired.
//! So two writers on one CPU can never interleave inside a sequence, and a
//! sequence that checks "I am on CPU c" first may treat CPU c's data as its
//! own.
//!
//! ```text
//!   arm:     rseq->rseq_cs = &descriptor         (start, length, abort ip)
//!   start:   rseq->cpu_id == c ?         no -> WrongCpu (thread migrated)
//!            [state] *foreign == 0 ?     no -> Foreign (see below)
//!            load, compare, compute
//!   commit:  one store                   <- the only visible effect
//!   post:    Done
//!   abort:   (kernel jumps here if preempted/signalled before `post`) -> Aborted
//! ```
//!
//! Writers that cannot run such a sequence on the right CPU — a thread
//! without an rseq area, a CPU number beyond the buffer's CPU count, or a
//! control operation (close, reinit) — still use locked instructions, and
//! for the 16-byte reservation state that is not enough: a locked CAS from
//! another CPU could land between an owner's load and its plain store. So
//! such a *foreign* writer first raises the region's `foreign` count and
//! then calls `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)`, which
//! aborts every sequence in flight in this process. Once it returns, every
//! owner sequence either finished before or will see `foreign != 0` and
//! take the locked path itself. Foreign writes pay a system call; owners,
//! which is every thread glibc created on a buffer's own CPU, pay none.
//!
//! Page commit words need no such dance: each page has a `local` word that
//! only owner sequences add to, and a `remote` word for everybody else
//! (`lock xadd`), see `region.rs`.
//!
//! Everything here is x86_64 only; elsewhere [`enabled`] is false and the
//! ring buffer stays on its locked (CAS) protocol, which is correct on its
//! own. `USTRACE_RINGBUF_RSEQ=0` in the environment forces that protocol.

use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

/// Result of one restartable sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The commit store happened.
    Done,
    /// The state did not hold the expected value; nothing was stored.
    Changed,
    /// The thread is not on the CPU the caller assumed; nothing was stored.
    WrongCpu,
    /// A foreign writer is active on the region; nothing was stored.
    Foreign,
    /// Preempted, migrated or signalled before the commit; nothing was stored.
    Aborted,
}

static INIT: std::sync::Once = std::sync::Once::new();
static OWNER_AREA: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// The calling thread's rseq area as [`owner_area`] gave it last: null
    /// until then, while owner writers do not use restartable sequences,
    /// and in a fork child (whose writers never become owners). Constant
    /// initialized and without a destructor, so reading it is one load
    /// and works in signal handlers and during thread exit.
    static AREA: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 7;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 8;

/// 0 on success. By the `syscall` instruction, not libc's `syscall()`: a foreign writer
/// fences owners between its look at the reservation state and its compare-and-swap, and a
/// probe on a library function called there would record into the same buffer, move the
/// state on and send the writer round again, into the same probe (see `Region::reserve`).
#[cfg(target_arch = "x86_64")]
fn membarrier(cmd: libc::c_long) -> libc::c_long {
    let ret: libc::c_long;
    // SAFETY: membarrier takes integers only and touches no user memory; the syscall
    // instruction clobbers rcx and r11, declared here, and nothing else.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_membarrier => ret,
            in("rdi") cmd,
            in("rsi") 0 as libc::c_long,
            in("rdx") 0 as libc::c_long,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(not(target_arch = "x86_64"))]
fn membarrier(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: membarrier takes integers only and touches no user memory.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    }
}

/// Decides, once per process, whether owner writers use restartable
/// sequences: x86_64, glibc registered rseq with a usable area, the kernel
/// accepts the expedited-rseq membarrier registration, and the environment
/// does not say `USTRACE_RINGBUF_RSEQ=0`. Not async-signal-safe the first time.
pub(crate) fn init() {
    // A `Once`, so that no caller goes on to make a buffer before the
    // decision is published (one that wrote unfenced as a foreign writer
    // while another thread's owners started plain stores would race them).
    INIT.call_once(|| {
        let wanted = std::env::var_os("USTRACE_RINGBUF_RSEQ").is_none_or(|v| v != "0");
        let offset = crate::cpu::rseq_area_offset().filter(|&off| off != 0);
        let on = cfg!(target_arch = "x86_64")
            && wanted
            && crate::cpu::rseq_here().is_some()
            && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ) == 0
            && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
        if let (true, Some(off)) = (on, offset) {
            OWNER_AREA.store(off, Ordering::Release);
        }
    });
}

/// In the child of a fork: no owner writers from now on (see
/// `RingBuffer`'s fork handling). The child's writes to buffers it
/// inherited are refused, and buffers it makes itself use the locked
/// protocol, which needs no fencing.
pub(crate) fn disable_after_fork() {
    OWNER_AREA.store(0, Ordering::Relaxed);
    // The child's only thread is the one that forked: its cached area goes too.
    let _ = AREA.try_with(|a| a.set(std::ptr::null_mut()));
}

/// Whether owner writers run restartable sequences (so foreign writers
/// must fence them out before touching reservation state).
#[inline]
pub(crate) fn enabled() -> bool {
    OWNER_AREA.load(Ordering::Relaxed) != 0
}

/// The calling thread's rseq area while owner writers use restartable
/// sequences (glibc registered one for every thread, covering `rseq_cs`);
/// `None` while they do not.
#[inline(always)]
pub(crate) fn owner_area() -> Option<*mut u8> {
    // One thread-local load on the writer's path, where the process-wide
    // offset cost two dependent loads (through the GOT) and the thread
    // pointer, all ahead of the CPU number and the buffer's slot.
    let cached = AREA.with(Cell::get);
    if !cached.is_null() {
        return Some(cached);
    }
    let off = OWNER_AREA.load(Ordering::Relaxed);
    if off == 0 {
        return None;
    }
    let area = crate::cpu::thread_pointer().wrapping_add_signed(off) as *mut u8;
    AREA.with(|a| a.set(area));
    Some(area)
}

/// Aborts every restartable sequence in flight in this process (and makes
/// the caller's earlier stores visible to them). Returns false if the
/// kernel refused, which only happens if registration was lost (after
/// `fork`, in the child: registration is per address space); it is
/// retried once after registering again.
pub(crate) fn fence_owners() -> bool {
    membarrier_registered(
        MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ,
        MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ,
    )
}

/// Runs membarrier `cmd`; if the kernel refuses it, registers with
/// `register` (a fork child starts unregistered) and tries once more.
fn membarrier_registered(cmd: libc::c_long, register: libc::c_long) -> bool {
    membarrier(cmd) == 0 || (membarrier(register) == 0 && membarrier(cmd) == 0)
}

/// A full memory barrier on every CPU running a thread of this process.
/// A reader about to sleep calls it between arming its wake flag and
/// looking for data: owner writers commit with plain stores and then load
/// the flag with no fence between, and this puts the fence there for them
/// (either their commit is visible to the reader's look, or their load
/// sees the flag). `false` if the kernel refused (then the reader's
/// periodic re-check covers the race).
pub(crate) fn barrier_writers() -> bool {
    membarrier_registered(
        MEMBARRIER_CMD_PRIVATE_EXPEDITED,
        MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
    )
}

/// The opening of a restartable sequence, as one asm template: the
/// `struct rseq_cs` descriptor (in the `__rseq_cs` section, 32-byte aligned
/// as the kernel requires) covering labels 4 (start) to 5 (post-commit),
/// abort at 6; arming `rseq->rseq_cs`; then, inside, the CPU check, which
/// leaves for the caller's `wrong_cpu` label. Needs operands `area`, `cpu`,
/// a scratch `tmp` and the label `wrong_cpu`.
#[cfg(target_arch = "x86_64")]
macro_rules! rseq_begin {
    () => {
        concat!(
            ".pushsection __rseq_cs, \"aw\"\n",
            ".balign 32\n",
            "3:\n",
            ".long 0, 0\n",
            ".quad 4f, (5f - 4f), 6f\n",
            ".popsection\n",
            "leaq 3b(%rip), {tmp}\n",
            "movq {tmp}, 8({area})\n",
            "4:\n",
            "cmpl {cpu:e}, 4({area})\n",
            "jne {wrong_cpu}\n",
        )
    };
}

/// The close of a restartable sequence, right after its commit store:
/// label 5 ends the asm, so a completed sequence falls straight through
/// into the caller's code. The abort handler lives out of line, in its own
/// text section (no jump over it on the hot path): glibc's x86 signature
/// 0x53053053 in the 4 bytes before label 6 (inside a `ud1`, so the bytes
/// still decode as one instruction), then a jump to the caller's `aborted`
/// label.
#[cfg(target_arch = "x86_64")]
macro_rules! rseq_end {
    () => {
        concat!(
            "5:\n",
            ".pushsection .text.ustrace_rseq_abort, \"ax\", @progbits\n",
            ".byte 0x0f, 0xb9, 0x3d\n",
            ".long 0x53053053\n",
            "6:\n",
            "jmp {aborted}\n",
            ".popsection\n",
        )
    };
}

/// On CPU `cpu`, if the `foreign` word 16 bytes past `state` is 0 and the
/// 16 bytes at `state` equal `old`, stores `new` there with one 16-byte
/// store (`movdqa`). One instruction is what makes it a single commit
/// point: an interrupt or preemption lands before or after it, never
/// inside. Readers on other
/// CPUs load the two halves separately and need each 8-byte half whole,
/// which an aligned store gives (and AVX CPUs make the whole 16 atomic).
///
/// Every outcome but `Done` leaves the asm by a jump to its own label, so
/// that once inlined the caller's `match` is the branches themselves.
///
/// # Safety
/// `area` is the calling thread's registered rseq area; `state` is 16-byte
/// aligned and writable, and the `foreign` word after it readable, for
/// the whole call.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn store_state_if(
    area: *mut u8,
    cpu: u32,
    state: *mut u64,
    old: [u64; 2],
    new: [u64; 2],
) -> Outcome {
    // SAFETY: the caller guarantees the pointers. The abort stub and the
    // exits lie outside [start, post) (see `rseq_begin`/`rseq_end`), and
    // the store at the end of the range is the only write.
    unsafe {
        // The new state enters as one vector register, built before the sequence, so
        // that its two words hold no general register across it.
        let x = core::arch::x86_64::_mm_set_epi64x(new[1] as i64, new[0] as i64);
        core::arch::asm!(
            rseq_begin!(),
            "cmpq $0, 16({state})",
            "jne {busy}",
            "cmpq {olo}, ({state})",
            "jne {changed}",
            "cmpq {ohi}, 8({state})",
            "jne {changed}",
            "movdqa {x}, ({state})",
            rseq_end!(),
            area = in(reg) area,
            cpu = in(reg) cpu,
            state = in(reg) state,
            olo = in(reg) old[0],
            ohi = in(reg) old[1],
            x = in(xmm_reg) x,
            tmp = out(reg) _,
            wrong_cpu = label { return Outcome::WrongCpu },
            busy = label { return Outcome::Foreign },
            changed = label { return Outcome::Changed },
            aborted = label { return Outcome::Aborted },
            options(att_syntax, nostack),
        );
    }
    Outcome::Done
}

/// On CPU `cpu`, adds `add` to the u64 at `word` with one non-locked
/// `add` to memory: a single instruction, so it is the commit point, and
/// atomic against everything else on this CPU.
///
/// # Safety
/// `area` is the calling thread's registered rseq area; `word` is 8-byte
/// aligned and writable, and written only by sequences of CPU `cpu` (plus
/// locked writes that cannot overlap them, see `region.rs`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn add_on_cpu(area: *mut u8, cpu: u32, word: *mut u64, add: u64) -> Outcome {
    // SAFETY: as in `store_state_if`; the `addq` to the word is the commit.
    unsafe {
        core::arch::asm!(
            rseq_begin!(),
            "addq {add}, ({word})",
            rseq_end!(),
            area = in(reg) area,
            cpu = in(reg) cpu,
            word = in(reg) word,
            add = in(reg) add,
            tmp = out(reg) _,
            wrong_cpu = label { return Outcome::WrongCpu },
            aborted = label { return Outcome::Aborted },
            options(att_syntax, nostack),
        );
    }
    Outcome::Done
}

/// Never called: [`enabled`] is false off x86_64.
///
/// # Safety
/// None needed; it does nothing.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
pub(crate) unsafe fn store_state_if(
    _area: *mut u8,
    _cpu: u32,
    _state: *mut u64,
    _foreign: *const u64,
    _old: [u64; 2],
    _new: [u64; 2],
) -> Outcome {
    Outcome::WrongCpu
}

/// Never called: [`enabled`] is false off x86_64.
///
/// # Safety
/// None needed; it does nothing.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
pub(crate) unsafe fn add_on_cpu(_area: *mut u8, _cpu: u32, _word: *mut u64, _add: u64) -> Outcome {
    Outcome::WrongCpu
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn here() -> Option<(*mut u8, u32)> {
        crate::cpu::init();
        init();
        if !enabled() {
            eprintln!("skipped: restartable sequences are not available here");
            return None;
        }
        crate::cpu::rseq_here()
    }

    #[test]
    fn store_state_if_compares_and_checks_cpu() {
        let Some(_) = here() else { return };
        // The state, then the foreign word 16 bytes on, as in a region.
        #[repr(align(16))]
        struct State([u64; 3]);
        let mut st = State([5, 7, 0]);
        let mut done = 0;
        for _ in 0..1000 {
            let (area, cpu) = crate::cpu::rseq_here().unwrap();
            let p = st.0.as_mut_ptr();
            // SAFETY: area is ours, the state is aligned and local, with its
            // foreign word after it.
            match unsafe { store_state_if(area, cpu, p, [1, 2], [9, 9]) } {
                Outcome::Changed => {}
                Outcome::Aborted | Outcome::WrongCpu => continue,
                o => panic!("mismatching state gave {o:?}"),
            }
            assert_eq!(st.0, [5, 7, 0]);
            // SAFETY: as above.
            match unsafe { store_state_if(area, cpu, p, [5, 7], [6, 8]) } {
                Outcome::Done => {
                    assert_eq!(st.0, [6, 8, 0]);
                    st.0 = [5, 7, 0];
                    done += 1;
                }
                Outcome::Aborted | Outcome::WrongCpu => {}
                o => panic!("matching state gave {o:?}"),
            }
            // SAFETY: as above; a CPU number no thread runs on.
            let o = unsafe { store_state_if(area, u32::MAX, p, [5, 7], [1, 1]) };
            assert!(matches!(o, Outcome::WrongCpu | Outcome::Aborted), "{o:?}");
            st.0[2] = 1;
            // SAFETY: as above; a foreign writer is marked active.
            let o = unsafe { store_state_if(area, cpu, st.0.as_mut_ptr(), [5, 7], [1, 1]) };
            assert!(
                matches!(o, Outcome::Foreign | Outcome::Aborted | Outcome::WrongCpu),
                "{o:?}"
            );
            assert_eq!(st.0, [5, 7, 1]);
            st.0[2] = 0;
        }
        assert!(done > 900, "only {done} of 1000 sequences completed");
    }

    const MAX_CPUS: usize = 256;
    static WORDS: [std::sync::atomic::AtomicU64; MAX_CPUS] =
        [const { std::sync::atomic::AtomicU64::new(0) }; MAX_CPUS];
    static HANDLER_ADDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    /// A nested writer: the signal handler adds to its CPU's word too.
    extern "C" fn add_in_handler(_: libc::c_int) {
        loop {
            let Some((area, cpu)) = crate::cpu::rseq_here() else {
                return;
            };
            // SAFETY: as in the workers below.
            if unsafe { add_on_cpu(area, cpu, WORDS[cpu as usize].as_ptr(), 1) } == Outcome::Done {
                HANDLER_ADDS.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }

    #[test]
    fn add_on_cpu_adds_exactly_under_preemption_and_signals() {
        let Some(_) = here() else { return };
        // More threads than CPUs, all adding to the word of "their" CPU with
        // plain read-modify-writes, while another thread keeps signalling
        // them and the handler adds too (a nested writer): the sum is exact
        // only if the kernel restarts every interrupted sequence, and the
        // abort count shows it had to.
        if crate::cpu::possible_cpus() > MAX_CPUS {
            eprintln!("skipped: more than {MAX_CPUS} cpus");
            return;
        }
        // SAFETY: installs an async-signal-safe handler (atomics and the
        // rseq sequence only) for SIGUSR2, which nothing else in this test
        // binary uses.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = add_in_handler as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
        }
        let words = &WORDS;
        let threads = 4 * std::thread::available_parallelism().map_or(2, |n| n.get());
        // Each thread adds at least this many times, and all keep adding
        // until a handler has run and a sequence was restarted (both are up
        // to the scheduler, so the test waits for them rather than hoping;
        // the deadline only bounds a machine where neither ever happens).
        let per = 300_000u64;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let aborted = std::sync::atomic::AtomicU64::new(0);
        let added = std::sync::atomic::AtomicU64::new(0);
        let below_minimum = std::sync::atomic::AtomicUsize::new(threads);
        let finish = std::sync::atomic::AtomicBool::new(false);
        let running = std::sync::atomic::AtomicUsize::new(threads);
        let stopped = std::sync::atomic::AtomicBool::new(false);
        let ids: Vec<std::sync::atomic::AtomicU64> = (0..threads)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect();
        std::thread::scope(|s| {
            for id in &ids {
                let (aborted, added, below_minimum, finish, running, stopped) = (
                    &aborted,
                    &added,
                    &below_minimum,
                    &finish,
                    &running,
                    &stopped,
                );
                s.spawn(move || {
                    // SAFETY: pthread_self has no preconditions.
                    id.store(unsafe { libc::pthread_self() } as u64, Ordering::SeqCst);
                    let mut done = 0u64;
                    while done < per || !finish.load(Ordering::Relaxed) {
                        let (area, cpu) = crate::cpu::rseq_here().unwrap();
                        let w = words[cpu as usize].as_ptr();
                        // SAFETY: area is this thread's; w is an aligned word
                        // only written by sequences on `cpu`.
                        match unsafe { add_on_cpu(area, cpu, w, 1) } {
                            Outcome::Done => {
                                done += 1;
                                if done == per {
                                    below_minimum.fetch_sub(1, Ordering::SeqCst);
                                }
                            }
                            Outcome::Aborted => {
                                aborted.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => {}
                        }
                    }
                    added.fetch_add(done, Ordering::SeqCst);
                    running.fetch_sub(1, Ordering::SeqCst);
                    // Stay alive until the signaller stops using our thread id.
                    while !stopped.load(Ordering::SeqCst) {
                        std::thread::yield_now();
                    }
                });
            }
            s.spawn(|| {
                while running.load(Ordering::SeqCst) > 0 {
                    for id in &ids {
                        let t = id.load(Ordering::SeqCst);
                        if t != 0 {
                            // SAFETY: the thread is alive until `stopped` is set,
                            // and SIGUSR2's handler is async-signal-safe.
                            unsafe { libc::pthread_kill(t as libc::pthread_t, libc::SIGUSR2) };
                        }
                    }
                    let seen = HANDLER_ADDS.load(Ordering::Relaxed) > 0
                        && aborted.load(Ordering::Relaxed) > 0;
                    if below_minimum.load(Ordering::SeqCst) == 0
                        && (seen || std::time::Instant::now() > deadline)
                    {
                        finish.store(true, Ordering::Relaxed);
                    }
                }
                stopped.store(true, Ordering::SeqCst);
            });
        });
        let total: u64 = words.iter().map(|w| w.load(Ordering::Relaxed)).sum();
        let nested = HANDLER_ADDS.load(Ordering::Relaxed);
        assert!(nested > 0, "no signal handler ever ran");
        assert_eq!(total, added.load(Ordering::SeqCst) + nested);
        assert!(
            aborted.load(Ordering::Relaxed) > 0,
            "no sequence was ever restarted"
        );
    }
}
