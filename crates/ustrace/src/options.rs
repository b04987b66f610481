//! Trace options: `trace_options` and the `options/` directory of each instance.
//!
//! Each option is one bit; both files read and write the same bits. Options that change how
//! output looks (`latency-format`, `verbose`, `fields`, `record-tgid`, `annotate`,
//! `hash-ptr`, `raw`, `hex`, `bin`, `sym-*`, `context-info`, `irq-info`) are read when the
//! trace is printed (`crate::output`). The others are handed, when written
//! (`tracefs::set_option`), to what acts on them: `overwrite` to the buffer, `record-cmd` to
//! the thread-id cache, `stacktrace` and `userstacktrace` to every event file's flag word (so
//! the record path pays nothing while they are off), `block` and `pause-on-trace` to the
//! readers of `trace_pipe` and `trace`.
//!
//! What the kernel's options mean here, where it differs:
//! - `stacktrace`: after each kept event, a `kernel_stack` entry (`<stack trace>`) with the
//!   calling thread's stack — a user-space stack, since the traced code runs in user space —
//!   from the probe that recorded the event outwards, symbolized when the trace is read.
//! - `userstacktrace`: a `user_stack` entry (`<user stack trace>`) with the first eight
//!   addresses of the same stack, printed as raw addresses as the kernel prints user stacks.
//! - `record-tgid`: every record in a ustrace buffer is written by this process, so the TGID
//!   column is this process's id, and `saved_tgids` lists the threads that have traced.
//! - `block` is not offered: on the kernel it only makes `poll` on `trace_pipe` report data
//!   (a non-blocking read still fails with `EAGAIN`), and none of our doors to the tracefs
//!   (in-process, control socket, FUSE) has `poll`.
//! - `print-parent`, `func_stack_trace` and `funcgraph-*` shape the function tracers'
//!   records and lines (`crate::ftrace`); `graph-time` is read by the function profiler's
//!   exit handler (`crate::ftrace::profile`). There is no `sleep-time`: a probe cannot see
//!   its thread scheduled out without a system call, so the profiler's times include sleep.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The options we keep, in the order the kernel lists them, with their defaults. Each one
/// does what ftrace.rst says (see the module notes); kernel options that have no meaning
/// here are left out rather than accepted and ignored.
pub const OPTIONS: &[(&str, bool)] = &[
    ("sym-offset", false),
    ("sym-addr", false),
    ("verbose", false),
    ("raw", false),
    ("hex", false),
    ("bin", false),
    ("fields", false),
    ("annotate", true),
    ("userstacktrace", false),
    ("context-info", true),
    ("latency-format", false),
    ("record-cmd", true),
    ("record-tgid", false),
    ("overwrite", true),
    ("disable_on_free", false),
    ("irq-info", true),
    ("markers", true),
    ("event-fork", false),
    ("pause-on-trace", false),
    ("hash-ptr", true),
    ("stacktrace", false),
    // The function tracers' (`crate::ftrace`).
    ("print-parent", true),
    ("func_stack_trace", false),
    ("funcgraph-overrun", false),
    ("funcgraph-cpu", true),
    ("funcgraph-overhead", true),
    ("funcgraph-proc", false),
    ("funcgraph-duration", true),
    ("funcgraph-abstime", false),
    ("funcgraph-tail", false),
    // The function profiler's (`crate::ftrace::profile`): off, a function's time leaves out
    // its profiled callees'.
    ("graph-time", true),
];

/// Looks an option's bit up by name.
pub fn bit(name: &str) -> Option<u64> {
    OPTIONS.iter().position(|(n, _)| *n == name).map(|i| 1 << i)
}

/// One instance's option bits.
pub struct Options {
    bits: AtomicU64,
}

impl Default for Options {
    fn default() -> Self {
        Self::new()
    }
}

impl Options {
    /// Every option at its default, as a new instance has them.
    pub fn new() -> Self {
        let bits = OPTIONS
            .iter()
            .enumerate()
            .filter(|(_, (_, on))| *on)
            .fold(0u64, |bits, (i, _)| bits | 1 << i);
        Options {
            bits: AtomicU64::new(bits),
        }
    }

    /// Whether option `name` is on; `false` for an unknown name.
    pub fn get(&self, name: &str) -> bool {
        bit(name).is_some_and(|b| self.bits.load(Ordering::Relaxed) & b != 0)
    }

    /// Whether the option whose [`bit`] is `bit` is on: one load, for hot paths.
    #[inline]
    pub fn has_bit(&self, bit: u64) -> bool {
        self.bits.load(Ordering::Relaxed) & bit != 0
    }

    /// Turns option `name` on or off; `false` when there is no such option.
    pub fn set(&self, name: &str, on: bool) -> bool {
        let Some(b) = bit(name) else { return false };
        if on {
            self.bits.fetch_or(b, Ordering::Relaxed);
        } else {
            self.bits.fetch_and(!b, Ordering::Relaxed);
        }
        true
    }

    /// The `trace_options` text: one option a line, `noNAME` when off.
    pub fn listing(&self) -> String {
        OPTIONS
            .iter()
            .map(|(name, _)| {
                if self.get(name) {
                    format!("{name}\n")
                } else {
                    format!("no{name}\n")
                }
            })
            .collect()
    }
}

/// Set once any instance turns `record-tgid` on: as the kernel allocates its tgid map then,
/// `saved_tgids` is empty until this happens.
static TGIDS_KEPT: AtomicBool = AtomicBool::new(false);

/// Called when an instance turns `record-tgid` on.
pub(crate) fn keep_tgids() {
    TGIDS_KEPT.store(true, Ordering::Relaxed);
}

/// The thread group of thread `tid` as the TGID column shows it. Only this process writes
/// into its buffers (a forked child refuses to write into inherited ones), so every thread
/// id a record carries belongs to this process; 0 is no thread.
pub fn tgid_of(tid: i32) -> Option<i32> {
    // SAFETY: getpid has no arguments and cannot fail.
    (tid > 0).then(|| unsafe { libc::getpid() })
}

/// The `saved_tgids` text: `PID TGID` for every thread whose name is saved, once
/// `record-tgid` has been on.
pub fn saved_tgids() -> String {
    if !TGIDS_KEPT.load(Ordering::Relaxed) {
        return String::new();
    }
    crate::thread::saved_cmdlines()
        .lines()
        .filter_map(|line| line.split_once(' ')?.0.parse::<i32>().ok())
        .filter_map(|tid| Some(format!("{tid} {}\n", tgid_of(tid)?)))
        .collect()
}
