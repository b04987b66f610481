//! Trace options: `trace_options` and the `options/` directory of each instance.
//!
//! Each option is one bit; both files read and write the same bits. Options that change how
//! output looks are read when the trace is printed; `overwrite` and `record-cmd` are passed
//! to the buffer and event files that act on them.

use std::sync::atomic::{AtomicU64, Ordering};

/// The options we keep, in the order the kernel lists them, with their defaults.
pub const OPTIONS: &[(&str, bool)] = &[
    ("print-parent", true),
    ("sym-offset", false),
    ("sym-addr", false),
    ("verbose", false),
    ("raw", false),
    ("hex", false),
    ("bin", false),
    ("block", false),
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

    pub fn get(&self, name: &str) -> bool {
        bit(name).is_some_and(|b| self.bits.load(Ordering::Relaxed) & b != 0)
    }

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
