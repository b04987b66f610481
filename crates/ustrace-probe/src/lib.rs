//! ustrace-probe: the language of dynamic events, parsed once into flat
//! programs that run on the probe-hit path without allocation.
//!
//! ```text
//!  "f:fprobes/rd vfs_read count=$arg3 name=+0($arg2):string"
//!        │ parse_command (command.rs, fetch.rs; ProbeEnv for symbols,
//!        ▼                DWARF signatures and eprobe source fields)
//!  DynCommand::Create(ProbeDefinition)  ── canonical() ──► text for dynamic_events
//!        │ compile
//!        ▼
//!  Program ── fields() / print_fmt() ──► format file
//!          ── record_size(ctx) + run(ctx, buf) ──► record (hot path, no alloc)
//!          ── print_event(record) ──► trace line
//! ```
//!
//! Rejections carry the kernel's error id, message, errno and caret
//! position ([`ProbeError::log_text`] gives the `error_log` entry).
//! Default event names of Rust functions follow one rule: every character
//! that is not an ASCII letter, digit or `_` becomes `_`
//! (`my_crate::io::read` → `my_crate__io__read__entry`); see [`command`].

pub mod command;
pub mod env;
pub mod error;
pub mod exec;
pub mod fetch;
pub mod num;
pub mod types;

pub use command::{parse_command, DynCommand, ProbeDefinition, ProbeKind, Removal};
pub use env::{FieldKind, FieldSpec, InspectEnv, NoEnv, ProbeEnv};
pub use error::{Errno, ErrorId, ProbeError};
pub use exec::{FetchContext, Program, COMMON_HEADER_SIZE};
pub use fetch::{ArgDef, EntryArgs, Insn};
pub use types::FetchType;
