//! ustrace-fprobe: function entry/exit probes patched into a running process, and static keys.
//!
//! DOCPLACEHOLDER

pub mod static_key;

mod arch;
mod dispatch;
mod fprobe;
mod unwind;

pub use arch::PtRegs;
pub use dispatch::{
    outstanding_frames, EntryAction, EntryHandler, ExitHandler, Probe, ARENA_WORDS, MAX_FRAMES,
};
pub use fprobe::{check_patchable, enabled_functions, Fprobe, FprobeBuilder, Refusal};
pub use unwind::{unwind_hook_status, UNWIND_ENTRY_POINTS};

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
