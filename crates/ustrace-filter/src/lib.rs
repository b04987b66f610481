//! ustrace-filter: the kernel's event-filter language and trigger-command
//! syntax, compiled once into flat programs that run on raw event records.
//!
//! Where it sits on the data path:
//!
//! ```text
//!   write "id == 1 && comm ~ \"ba*\"" to events/S/E/filter
//!        │  (event core, not this crate)
//!        ▼
//!   compile(text, format fields, env) ──► Program (immutable, Send + Sync)
//!        │  error: FilterError → errno + `filter` text + error_log entry
//!        ▼
//!   event fires ─► record bytes ─► Program::matches(record, ctx) ─► keep/drop
//!                                  (no lock, no allocation, no syscall)
//!
//!   write "traceoff:3 if id == 1" to events/S/E/trigger
//!        ▼
//!   trigger::parse(text) ──► Command{kind, count, filter} ──► Trigger (counter)
//! ```
//!
//! Records use the kernel layout: `u16 common_type @0, u8 common_flags @2,
//! u8 common_preempt_count @3, i32 common_pid @4`, then the event's fields;
//! `__data_loc` strings are a u32 `len << 16 | offset`.
//!
//! The behaviour was taken from, and is tested against, a live kernel (6.18):
//! the same text is accepted or rejected alike, with the same errno, message
//! and caret. Notable kernel facts this crate keeps: bare (unquoted) strings
//! are rejected ("Invalid value (did you forget quotes)?"); `common_comm` and
//! `.string` do not exist; `comm ~ "*sh"` never matches (the kernel compares
//! the end of the 16-byte comm buffer); integer fields whose size is not
//! 1/2/4/8 never match, nor does any predicate on the `STACKTRACE` pseudo
//! field (see [`FieldClass::StackTrace`]); and a failed write leaves the
//! event *unfiltered* (checked with recorded events on 6.18).

//! # Contract with the event core (checked against the live kernel)
//!
//! Writing to an event's `filter` file:
//!
//! 0. A write of [`MAX_WRITE`] bytes or more (trailing blanks count) fails
//!    with `EINVAL` and changes nothing: the filter in force, the file's
//!    text and `error_log` stay as they were. [`compile`] returns
//!    [`FilterError::is_write_too_long`] for it and [`is_clear`] is false, so
//!    a caller that hands over the whole write, untrimmed, gets this right.
//! 1. [`is_clear`] (`0`, whitespace around allowed): remove the filter; the
//!    file reads `none`.
//! 2. Otherwise [`compile`] against the event's format fields.
//!    * `Ok(p)`: install `p` (RCU-style swap; readers may still run the old
//!      one); the file reads `p.text()` plus a newline.
//!    * `Err(e)`: the write fails with `e.errno()`. Unless
//!      [`FilterError::is_write_too_long`], the event's filter is *removed*
//!      (the event is now unfiltered — the kernel does not keep the old one),
//!      the file reads [`FilterError::filter_file_text`], and
//!      [`FilterError::error_log_entry`] is appended to the instance's
//!      `error_log` (after a `[timestamp] ` prefix, one entry per failure).
//!
//! Writing to a subsystem's `filter` file: a write of [`MAX_WRITE`] bytes or
//! more fails first, as above, touching no event. Otherwise the same text is
//! compiled for each event of the subsystem; each event gets its program or,
//! on failure, [`FilterError::for_subsystem`] (its old filter removed, so it
//! is unfiltered; error text; log entry); the write succeeds if the
//! subsystem has any event, even when every event failed, and the subsystem
//! file always reads [`SUBSYSTEM_FILTER_HELP`].
//!
//! Text after a NUL byte is not part of the write (the kernel reads it as a
//! C string): it is neither compiled nor shown in `filter` or `error_log`.
//!
//! Triggers: see [`trigger`].

pub mod cpulist;
pub mod ctype;
mod error;
mod field;
pub mod hist;
mod parse;
mod program;
pub mod strmatch;
pub mod synth;
pub mod trigger;

pub use error::{ErrorKind, FilterError, MAX_WRITE, SEQ_LIMIT, SUBSYSTEM_FILTER_HELP};
pub use field::{Field, FieldClass, COMMON_FIELDS};
pub use parse::{
    compile, is_clear, possible_cpus, AddressResolver, CompileEnv, FunctionResolver, MAX_NUMBER,
    MAX_STRING,
};
pub use program::{Context, Program, StrReader};

#[cfg(test)]
mod send_sync {
    #[test]
    fn program_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<super::Program>();
        check::<super::trigger::Trigger>();
    }
}
