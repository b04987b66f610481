//! Which CPU the calling thread runs on, cheaply — it picks the per-CPU
//! buffer for every event.
//!
//! glibc (2.35+) registers a restartable-sequences area for every thread;
//! the kernel keeps its `cpu_id` field up to date on every return to user
//! space. Reading it is one load from the thread pointer:
//!
//! ```text
//!   thread pointer (fs base / tpidr_el0)
//!        + __rseq_offset            (exported by glibc, fixed per process)
//!        = struct rseq { u32 cpu_id_start; u32 cpu_id; ... }
//! ```
//!
//! glibc exports `__rseq_size` (0 when registration is off, e.g. with
//! `GLIBC_TUNABLES=glibc.pthread.rseq=0`) and `__rseq_offset`. We look them
//! up once with `dlsym` (so an older glibc still links) and fall back to
//! `sched_getcpu` (vDSO on x86_64) when rseq is not there. The answer may be
//! stale by the time it is used — the thread can migrate — which the ring
//! buffer tolerates: per-CPU buffers accept writers from any CPU.

use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::sync::Once;

/// Offset of the rseq area from the thread pointer; `NO_RSEQ` when unusable.
static RSEQ_OFFSET: AtomicIsize = AtomicIsize::new(NO_RSEQ);
/// Whether glibc's registered area reaches the `rseq_cs` field (offset 8),
/// so the ring buffer may run restartable sequences in it.
static RSEQ_CS_USABLE: AtomicBool = AtomicBool::new(false);
const NO_RSEQ: isize = isize::MIN;
static INIT: Once = Once::new();

/// Resolves glibc's rseq registration once (not async-signal-safe the first time).
pub fn init() {
    INIT.call_once(|| {
        if let Some((off, size)) = rseq_offset() {
            RSEQ_OFFSET.store(off, Ordering::Relaxed);
            RSEQ_CS_USABLE.store(size >= 16, Ordering::Relaxed);
        }
    });
}

fn rseq_offset() -> Option<(isize, u32)> {
    if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        return None;
    }
    // SAFETY: dlsym with RTLD_DEFAULT and NUL-terminated names only looks symbols up.
    let (size, off) = unsafe {
        (
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
        )
    };
    if size.is_null() || off.is_null() {
        return None;
    }
    // SAFETY: glibc defines `unsigned int __rseq_size` and `ptrdiff_t __rseq_offset`;
    // both are initialised before main and never change afterwards.
    let (size, off) = unsafe { (*(size as *const u32), *(off as *const isize)) };
    if size < 8 {
        return None;
    }
    // Registration is per thread; check this one actually has a cpu.
    let cpu = read_rseq_cpu(off);
    (cpu >= 0).then_some((off, size))
}

#[inline(always)]
pub(crate) fn thread_pointer() -> usize {
    let tp: usize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reading the TCB self-pointer at %fs:0 is how the x86_64 TLS ABI
    // defines the thread pointer; it has no side effects.
    unsafe {
        core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: tpidr_el0 holds the thread pointer on aarch64 Linux; reading it has no side effects.
    unsafe {
        core::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        tp = 0;
    }
    tp
}

#[inline]
fn read_rseq_cpu(off: isize) -> i32 {
    let area = thread_pointer().wrapping_add_signed(off);
    // SAFETY: glibc registered a `struct rseq` at thread pointer + __rseq_offset
    // for every thread (size checked >= 8); cpu_id is the u32 at offset 4,
    // updated by the kernel, hence the volatile read.
    unsafe { core::ptr::read_volatile((area + 4) as *const i32) }
}

/// The calling thread's rseq area and the CPU it says the thread is on,
/// when glibc registered one for this thread that covers `rseq_cs` (the
/// ring buffer's restartable sequences need it); `None` otherwise.
#[inline]
pub(crate) fn rseq_here() -> Option<(*mut u8, u32)> {
    if !RSEQ_CS_USABLE.load(Ordering::Relaxed) {
        return None;
    }
    let off = RSEQ_OFFSET.load(Ordering::Relaxed);
    let cpu = read_rseq_cpu(off);
    (cpu >= 0).then(|| {
        (
            thread_pointer().wrapping_add_signed(off) as *mut u8,
            cpu as u32,
        )
    })
}

/// The offset of every thread's rseq area from its thread pointer, when
/// glibc registered areas that cover `rseq_cs` (see [`rseq_here`]).
pub(crate) fn rseq_area_offset() -> Option<isize> {
    let off = RSEQ_OFFSET.load(Ordering::Relaxed);
    (RSEQ_CS_USABLE.load(Ordering::Relaxed) && off != NO_RSEQ).then_some(off)
}

/// The CPU an area from `rseq::owner_area` names, as unsigned: an
/// unregistered thread's negative "no CPU" values become huge and match no
/// buffer.
///
/// # Safety
/// `area` comes from `rseq::owner_area`.
#[inline(always)]
pub(crate) unsafe fn rseq_area_cpu(area: *mut u8) -> u32 {
    // SAFETY: the caller's area is this thread's `struct rseq`; cpu_id is
    // the u32 at offset 4, written by the kernel, hence volatile.
    unsafe { core::ptr::read_volatile(area.add(4).cast::<u32>()) }
}

/// The CPU the calling thread is running on (as of the last return to user space).
#[inline]
pub fn current_cpu() -> usize {
    let off = RSEQ_OFFSET.load(Ordering::Relaxed);
    if off != NO_RSEQ {
        let cpu = read_rseq_cpu(off);
        if cpu >= 0 {
            return cpu as usize;
        }
    }
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        0
    } else {
        cpu as usize
    }
}

/// Number of possible CPUs (highest possible CPU id + 1), as the kernel
/// sizes its per-CPU buffers.
pub fn possible_cpus() -> usize {
    if let Ok(s) = std::fs::read_to_string("/sys/devices/system/cpu/possible") {
        if let Some(max) = parse_cpu_list_max(s.trim()) {
            return max + 1;
        }
    }
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    if n > 0 {
        n as usize
    } else {
        1
    }
}

/// Highest CPU number in a list like "0-3,8,10-11".
fn parse_cpu_list_max(s: &str) -> Option<usize> {
    let mut max = None;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let hi = part.rsplit('-').next()?;
        let v: usize = hi.trim().parse().ok()?;
        max = Some(max.map_or(v, |m: usize| m.max(v)));
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_list() {
        assert_eq!(parse_cpu_list_max("0"), Some(0));
        assert_eq!(parse_cpu_list_max("0-3"), Some(3));
        assert_eq!(parse_cpu_list_max("0-3,8,10-11"), Some(11));
        assert_eq!(parse_cpu_list_max("x"), None);
    }

    #[test]
    fn rseq_agrees_with_sched_getcpu() {
        init();
        assert!(possible_cpus() >= 1);
        let mut agree = 0;
        for _ in 0..1000 {
            // SAFETY: no preconditions.
            let a = unsafe { libc::sched_getcpu() } as usize;
            let b = current_cpu();
            // SAFETY: no preconditions.
            let c = unsafe { libc::sched_getcpu() } as usize;
            assert!(b < possible_cpus());
            if a == b && b == c {
                agree += 1;
            }
        }
        // A migration between the reads can make one sample differ, never most.
        assert!(
            agree > 900,
            "rseq cpu agreed with sched_getcpu only {agree}/1000 times"
        );
        if RSEQ_OFFSET.load(Ordering::Relaxed) == NO_RSEQ {
            eprintln!(
                "skipped: rseq not registered by glibc; tested the sched_getcpu fallback only"
            );
        }
    }

    #[test]
    fn threads_see_their_own_rseq_area() {
        init();
        let h = std::thread::spawn(current_cpu);
        assert!(h.join().unwrap() < possible_cpus());
    }
}
