//! The architecture boundary: everything that knows instruction encodings, registers or calling
//! conventions lives under `arch/<name>/`. The rest of the crate (registry, dispatcher, shadow
//! stack, static-key bookkeeping) calls only the functions re-exported here.
//!
//! To port to another architecture, add `arch/<name>/` providing the same items as
//! `arch/x86_64/mod.rs`; until then `unsupported` makes registration return
//! [`Error::Unsupported`](crate::Error::Unsupported).

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use x86_64::PtRegs;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::*;

#[cfg(not(target_arch = "x86_64"))]
mod unsupported;
#[cfg(not(target_arch = "x86_64"))]
pub use unsupported::PtRegs;
#[cfg(not(target_arch = "x86_64"))]
pub(crate) use unsupported::*;
