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

//!
//! # Wiring it into a tracefs
//!
//! * `dynamic_events` write: [`parse_command`] with a [`ProbeEnv`] that knows
//!   the events (`event_fields`), tracepoints and debug info ([`InspectEnv`]
//!   gives symbols and DWARF). `Create` → check `group/event` is free (else
//!   `def.error(ErrorId::EVENT_EXIST, 0, 0, Errno::Exist)`), attach, and show
//!   [`ProbeDefinition::canonical`] on read; `Remove` → every definition
//!   with [`ProbeDefinition::matches`], `ENOENT` when none. On `Err(e)`
//!   return `e.errno` and append `[timestamp] ` + [`ProbeError::log_text`]
//!   to `error_log` (nothing when `e.id` is `None`).
//! * The event: [`ProbeDefinition::compile`] → [`Program::fields`] and
//!   [`Program::print_fmt`] for the format file.
//! * A hit: implement [`FetchContext`] over the probe's registers/arguments,
//!   then `record_size` → reserve `COMMON_HEADER_SIZE + n` → `run` into the
//!   bytes after the common header → commit. Exit probes with
//!   [`Program::entry_data_size`] > 0 call [`Program::save_entry`] from the
//!   entry handler into per-call storage and hand it back through
//!   [`FetchContext::entry_data`] at exit.
//! * Reading the trace: [`Program::print_event`].
//!
//! `%REG` is refused in fprobes/tprobes as the kernel does unless
//! [`ProbeEnv::fprobe_registers`] says otherwise; `$argN` of a tprobe is the
//! N-th tracepoint argument (the kernel's hidden stub argument has no
//! counterpart here).

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
pub use exec::{DirectArg, DirectSrc, FetchContext, Program, COMMON_HEADER_SIZE};
pub use fetch::{ArgDef, EntryArgs, Insn};
pub use types::FetchType;
