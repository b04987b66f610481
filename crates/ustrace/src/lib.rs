//! ustrace: the Linux kernel's event tracing, inside a user-space process.
//!
//! See `ARCHITECTURE.md` at the repository root for the data path and where each part lives.

pub mod rcu;
pub mod tracepoint;

#[doc(hidden)]
pub mod __private {
    pub use linkme;
}
