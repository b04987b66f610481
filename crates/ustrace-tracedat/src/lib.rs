//! trace-cmd's `trace.dat`, written and read.
//!
//! A recording is the ring-buffer pages of every CPU plus what is needed to decode them:
//! the page and record header layouts, the event formats, the thread names and the clock.
//! ustrace's buffers are already in the kernel's page format (`ustrace-ringbuf`), so the
//! [`Writer`] copies pages as `per_cpu/cpuN/trace_pipe_raw` gives them, next to a
//! [`TraceMeta`] read from the tracefs, and the real `trace-cmd report` reads the file. The
//! [`Reader`] parses such files (ours or trace-cmd's), decodes each record with the formats
//! in the file and merges the CPUs by time; [`text`] prints events as `trace-cmd report`
//! does, for `ustrace report` and `ustrace stream`.
//!
//! ```text
//!  tracefs ── TraceMeta::from_tracefs ──┐
//!  trace_pipe_raw pages ── push_page ───┴─ Writer ── trace.dat ── Reader ── Event ── text
//! ```

pub mod format;
pub mod meta;
pub mod page;
pub mod read;
pub mod text;
pub mod write;

pub use format::{EventFormat, Field, FieldType};
pub use meta::TraceMeta;
pub use page::{count_records, decode_page, DecodedPage, PageLayout, PageRecord};
pub use read::{field_value, Decoder, Event, Reader, Value};
pub use text::Printer;
pub use write::{WriteSummary, Writer};
