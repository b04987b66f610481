//! ustrace-fprobe: function entry/exit probes patched into a running process, and static keys.
//!
//! (Full design notes are filled in below as the modules land.)

pub mod static_key;

mod arch;

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
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Unsupported(why) => write!(f, "unsupported: {why}"),
            Error::Patch(why) => write!(f, "patch failed: {why}"),
            Error::TooManySites => write!(f, "too many patch sites (trap table full)"),
        }
    }
}

impl std::error::Error for Error {}
