//! Trace clocks: the `trace_clock` choices of the kernel, in user space.
//!
//! The writer calls [`now`] once per event, so every clock here is read
//! without a system call: `local`/`perf` read the TSC and scale it to
//! nanoseconds with a multiplier calibrated once (in [`init`], which
//! `RingBuffer::new` calls; kept per user and boot in `/dev/shm`, so later programs
//! only check it), the `clock_gettime` based ones go through the
//! vDSO, `counter` is one atomic increment and `x86-tsc` is the raw TSC.
//!
//! ```text
//!   local / perf   rdtsc * mult >> 32          (ns, ~per-CPU, cheapest)
//!   global / mono  CLOCK_MONOTONIC             (ns)
//!   mono_raw       CLOCK_MONOTONIC_RAW         (ns)
//!   boot           CLOCK_BOOTTIME              (ns)
//!   tai            CLOCK_TAI                   (ns)
//!   uptime         CLOCK_MONOTONIC_COARSE      (ns, tick resolution like jiffies)
//!   counter        global atomic counter       (not time)
//!   x86-tsc        rdtsc                       (cycles)
//! ```
//!
//! The ring buffer never lets time run backwards inside one CPU buffer (it
//! takes the maximum of the clock and the last stamp), so a clock that is
//! only approximately synchronised across CPUs (the TSC) is safe to use.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

/// A trace clock, as listed in tracefs `trace_clock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum Clock {
    /// TSC scaled to nanoseconds (the default).
    #[default]
    Local = 0,
    /// Monotonic nanoseconds, consistent across CPUs.
    Global = 1,
    /// A global incrementing counter.
    Counter = 2,
    /// Coarse (tick resolution) monotonic time.
    Uptime = 3,
    /// Same source as `local`, as the kernel's perf clock.
    Perf = 4,
    /// `CLOCK_MONOTONIC`.
    Mono = 5,
    /// `CLOCK_MONOTONIC_RAW`.
    MonoRaw = 6,
    /// `CLOCK_BOOTTIME`.
    Boot = 7,
    /// `CLOCK_TAI`.
    Tai = 8,
    /// The raw time-stamp counter.
    X86Tsc = 9,
}

impl Clock {
    /// Every clock, in the order tracefs lists them.
    pub const ALL: [Clock; 10] = [
        Clock::Local,
        Clock::Global,
        Clock::Counter,
        Clock::Uptime,
        Clock::Perf,
        Clock::Mono,
        Clock::MonoRaw,
        Clock::Boot,
        Clock::Tai,
        Clock::X86Tsc,
    ];

    /// The tracefs name.
    pub fn name(self) -> &'static str {
        match self {
            Clock::Local => "local",
            Clock::Global => "global",
            Clock::Counter => "counter",
            Clock::Uptime => "uptime",
            Clock::Perf => "perf",
            Clock::Mono => "mono",
            Clock::MonoRaw => "mono_raw",
            Clock::Boot => "boot",
            Clock::Tai => "tai",
            Clock::X86Tsc => "x86-tsc",
        }
    }

    /// Parses a tracefs name.
    pub fn from_name(name: &str) -> Option<Clock> {
        Clock::ALL.iter().copied().find(|c| c.name() == name.trim())
    }

    /// Whether the clock counts nanoseconds (`counter` and `x86-tsc` do not).
    pub fn in_nanos(self) -> bool {
        !matches!(self, Clock::Counter | Clock::X86Tsc)
    }

    pub(crate) fn from_u32(v: u32) -> Clock {
        Clock::ALL.get(v as usize).copied().unwrap_or_default()
    }
}

impl std::fmt::Display for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);
/// ns = tsc * MULT >> 32; 0 = the TSC is not usable, use CLOCK_MONOTONIC.
static TSC_MULT: AtomicU64 = AtomicU64::new(0);
static INIT: Once = Once::new();

/// Calibrates the TSC scale once. Cheap after the first call; not
/// async-signal-safe the first time (it sleeps ~5 ms).
pub fn init() {
    INIT.call_once(calibrate);
}

/// The current time of `clock` (see the module table for units).
#[inline(always)]
pub fn now(clock: Clock) -> u64 {
    if clock == Clock::Local {
        return local();
    }
    now_other(clock)
}

#[inline(never)]
fn now_other(clock: Clock) -> u64 {
    match clock {
        Clock::Local | Clock::Perf => local(),
        Clock::Global | Clock::Mono => gettime(libc::CLOCK_MONOTONIC),
        Clock::MonoRaw => gettime(libc::CLOCK_MONOTONIC_RAW),
        Clock::Boot => gettime(libc::CLOCK_BOOTTIME),
        Clock::Tai => gettime(libc::CLOCK_TAI),
        Clock::Uptime => gettime(libc::CLOCK_MONOTONIC_COARSE),
        Clock::Counter => COUNTER.fetch_add(1, Ordering::Relaxed) + 1,
        Clock::X86Tsc => tsc().unwrap_or_else(|| gettime(libc::CLOCK_MONOTONIC_RAW)),
    }
}

/// The TSC's scale to ns (never 0) when `local` is the scaled TSC, so that
/// [`local_tsc`] may be used with it.
pub(crate) fn local_tsc_mult() -> Option<u64> {
    let mult = TSC_MULT.load(Ordering::Relaxed);
    (tsc().is_some() && mult != 0).then_some(mult)
}

/// `local`, given the scale [`local_tsc_mult`] gave: the TSC scaled to
/// ns, with no check of its own (the writer's fast path checked once, in
/// advance, and keeps the scale where it looks anyway).
#[inline(always)]
pub(crate) fn local_tsc(mult: u64) -> u64 {
    tsc_ns(mult).unwrap_or(0)
}

#[inline(always)]
fn local() -> u64 {
    let mult = TSC_MULT.load(Ordering::Relaxed);
    if mult != 0 {
        if let Some(ns) = tsc_ns(mult) {
            return ns;
        }
    }
    gettime(libc::CLOCK_MONOTONIC)
}

/// The TSC scaled by `mult` (`tsc * mult >> 32`), read and scaled in one
/// asm block: the compiler cannot hoist the read away from its scaling and
/// keep the multiplier (or the raw count) in a stack slot meanwhile, which
/// puts a store-forwarding round trip on the path from the clock to the
/// reservation. `None` where there is no TSC.
#[inline(always)]
fn tsc_ns(mult: u64) -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        let ns: u64;
        // SAFETY: rdtsc and arithmetic on registers only; no memory touched.
        unsafe {
            core::arch::asm!(
                "rdtsc",
                "shlq $32, %rdx",
                "orq %rdx, %rax",
                "mulq {mult}",
                "shrdq $32, %rdx, %rax",
                mult = in(reg) mult,
                out("rax") ns,
                out("rdx") _,
                options(att_syntax, nomem, nostack),
            );
        }
        Some(ns)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = mult;
        None
    }
}

#[inline]
fn gettime(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime is served by
    // the vDSO for these clock ids and is async-signal-safe.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline]
fn tsc() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no memory effects and is available on every x86_64 CPU.
        Some(unsafe { core::arch::x86_64::_rdtsc() })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// The TSC is usable as `local` when it ticks at a constant rate through
/// idle states (what the kernel calls a reliable TSC).
fn tsc_is_invariant() -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    has("constant_tsc") && has("nonstop_tsc")
}

fn calibrate() {
    if tsc().is_none() || !tsc_is_invariant() {
        return;
    }
    // An invariant TSC keeps one rate for the whole boot: measured once, a scale is kept
    // for the next program of the same user, which then starts without the 15 ms of
    // sleeps below (a preloaded agent pays them before the program's `main`).
    let cache = calibration_cache();
    if let Some((path, boot)) = &cache {
        if let Some(mult) = cached_mult(path, boot) {
            TSC_MULT.store(mult, Ordering::Relaxed);
            return;
        }
    }
    measure();
    if let Some((path, boot)) = &cache {
        let mult = TSC_MULT.load(Ordering::Relaxed);
        if mult != 0 {
            store_mult(path, boot, mult);
        }
    }
}

/// Where this user's calibration is kept, and the boot it must belong to.
fn calibration_cache() -> Option<(std::path::PathBuf, String)> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let boot = boot.trim().to_string();
    if boot.is_empty() || boot.contains(char::is_whitespace) {
        return None;
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    Some((format!("/dev/shm/ustrace-tsc-{uid}").into(), boot))
}

/// A scale kept by [`store_mult`], if it is this user's own file (not a link, writable by
/// nobody else), of this boot, plausible (0.05 to 10 ns per tick) and agrees within 1%
/// with the raw monotonic clock over a short spin; otherwise `None`, and the caller
/// measures afresh.
fn cached_mult(path: &std::path::Path, boot: &str) -> Option<u64> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.is_file() || meta.uid() != uid || meta.mode() & 0o022 != 0 || meta.len() > 256 {
        return None;
    }
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    let (kept_boot, mult) = text.trim().split_once(' ')?;
    let mult: u64 = mult.parse().ok()?;
    const ONE: u64 = 1 << 32;
    if kept_boot != boot || !(ONE / 20..=ONE * 10).contains(&mult) {
        return None;
    }
    // A 100 µs check: cheap next to a calibration, and it catches a scale that no longer
    // fits (a file from elsewhere, a TSC that changed rate after all).
    let (n0, t0) = (gettime(libc::CLOCK_MONOTONIC_RAW), tsc()?);
    let (mut n1, mut t1) = (n0, t0);
    while n1 - n0 < 100_000 {
        n1 = gettime(libc::CLOCK_MONOTONIC_RAW);
        t1 = tsc()?;
    }
    let scaled = ((u128::from(t1.wrapping_sub(t0)) * u128::from(mult)) >> 32) as u64;
    let real = n1 - n0;
    (scaled.abs_diff(real) * 100 <= real).then_some(mult)
}

/// Keeps `mult` for [`cached_mult`]: written to a private temporary file and renamed into
/// place, so a reader sees a whole line or none. Failing to keep it costs only the next
/// program's calibration.
fn store_mult(path: &std::path::Path, boot: &str, mult: u64) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| f.write_all(format!("{boot} {mult}\n").as_bytes()));
    if written.is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Measures the TSC's rate against the raw monotonic clock.
fn measure() {
    // Two samples 5 ms apart against the raw monotonic clock; take the
    // tightest bracket of a few tries so a preemption does not skew it.
    let sample = || {
        let a = gettime(libc::CLOCK_MONOTONIC_RAW);
        let t = tsc().unwrap_or(0);
        let b = gettime(libc::CLOCK_MONOTONIC_RAW);
        (a / 2 + b / 2, t, b - a)
    };
    let mut best: Option<(u64, u64, u64)> = None;
    for _ in 0..3 {
        let (n0, t0, w0) = sample();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (n1, t1, w1) = sample();
        if t1 <= t0 || n1 <= n0 {
            continue;
        }
        let err = w0 + w1;
        if best.is_none_or(|b| err < b.2) {
            let mult = ((u128::from(n1 - n0) << 32) / u128::from(t1 - t0)) as u64;
            best = Some((mult, 0, err));
        }
    }
    if let Some((mult, _, _)) = best {
        TSC_MULT.store(mult.max(1), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept scale is taken back only for the same boot, when plausible and agreeing with
    /// the clock, and only from a file nobody else may write.
    #[test]
    fn a_kept_calibration_is_checked_before_use() {
        if tsc().is_none() || !tsc_is_invariant() {
            eprintln!("skipped: no invariant TSC here");
            return;
        }
        init();
        let Some(mult) = local_tsc_mult() else {
            eprintln!("skipped: the TSC was not calibrated");
            return;
        };
        let dir = std::env::temp_dir().join(format!("ustrace-clock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tsc");
        let _ = std::fs::remove_file(&path);
        assert_eq!(cached_mult(&path, "boot-a"), None, "no file yet");
        store_mult(&path, "boot-a", mult);
        assert_eq!(cached_mult(&path, "boot-a"), Some(mult));
        assert_eq!(cached_mult(&path, "boot-b"), None, "another boot");
        store_mult(&path, "boot-a", mult * 2);
        assert_eq!(
            cached_mult(&path, "boot-a"),
            None,
            "disagrees with the clock"
        );
        store_mult(&path, "boot-a", 7);
        assert_eq!(cached_mult(&path, "boot-a"), None, "implausible");
        store_mult(&path, "boot-a", mult);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(cached_mult(&path, "boot-a"), None, "writable by others");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_round_trip() {
        for c in Clock::ALL {
            assert_eq!(Clock::from_name(c.name()), Some(c));
            assert_eq!(Clock::from_u32(c as u32), c);
        }
        assert_eq!(Clock::from_name("nope"), None);
        assert_eq!(Clock::default().name(), "local");
    }

    #[test]
    fn local_tracks_monotonic_rate() {
        init();
        let l0 = now(Clock::Local);
        let m0 = now(Clock::Mono);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let l1 = now(Clock::Local);
        let m1 = now(Clock::Mono);
        let (dl, dm) = ((l1 - l0) as f64, (m1 - m0) as f64);
        assert!(
            (dl / dm - 1.0).abs() < 0.05,
            "local advanced {dl} ns while mono advanced {dm} ns"
        );
    }

    #[test]
    fn clocks_advance_and_counter_counts() {
        init();
        for c in Clock::ALL {
            let a = now(c);
            std::thread::sleep(std::time::Duration::from_millis(15));
            let b = now(c);
            assert!(b > a, "{c} did not advance: {a} -> {b}");
        }
        let a = now(Clock::Counter);
        let b = now(Clock::Counter);
        assert!(b > a);
    }
}
