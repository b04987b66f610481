//! ustrace: the Linux kernel's event tracing, inside a user-space process.
//!
//! Declare events in your code, turn them on through a tracefs that behaves like the
//! kernel's `/sys/kernel/tracing`, and read the trace in the kernel's text layout: from the
//! program itself, or from a shell through `ustrace mount`.
//!
//! # Declare, enable, read
//!
//! ```
//! use std::time::Duration;
//! use ustrace::FileSystem;
//!
//! ustrace::trace_event! {
//!     /// A GET finished.
//!     pub fn kv::get(key: &str, hit: bool, latency_ns: u64) {
//!         key: &str = key,
//!         hit: bool = hit,
//!         latency_ns: u64 = latency_ns,
//!     }
//!     print "key=%s hit=%d latency_ns=%llu", key, hit, latency_ns;
//! }
//!
//! fn main() -> Result<(), ustrace::Errno> {
//!     let tracefs = ustrace::tracefs();
//!     tracefs.write_file("events/kv/get/enable", "1")?; // echo 1 > events/kv/get/enable
//!     get::trace("alpha", true, 1200);
//!     // cat trace_pipe, until nothing new comes for 100 ms
//! #   let mut seen = 0;
//!     for line in tracefs.read_lines("trace_pipe", Some(Duration::from_millis(100)))? {
//!         let line = line?;
//!         assert!(line.ends_with("get: key=alpha hit=1 latency_ns=1200"));
//!         println!("{line}");
//! #       seen += 1;
//!     }
//! #   assert_eq!(seen, 1);
//!     Ok(())
//! }
//! ```
//!
//! - **Declare** with [`trace_event!`]: it makes a module named after the event (`get`)
//!   whose `trace(…)` records the event. While the event is off, a call site is a 5-byte NOP
//!   (x86-64; one load elsewhere) that enabling patches into a jump
//!   ([`tracepoint`] has the details). [`declare_tracepoint!`] makes a bare tracepoint.
//! - **Enable** and configure through the files a kernel user writes, with [`tracefs()`],
//!   which implements [`FileSystem`]: [`write_file`](FileSystem::write_file) is
//!   `echo … > FILE`, [`append_file`](FileSystem::append_file) is `echo … >> FILE`.
//!   Filters, triggers, instances, options and dynamic events are files too.
//! - **Read** with [`read_to_string`](FileSystem::read_to_string) (`cat trace`, a snapshot)
//!   or [`read_lines`](FileSystem::read_lines) (`cat trace_pipe`, consuming).
//!   [`FileSystem::open`] gives an [`OpenFile`], [`FileSystem::open_file`] the same as a
//!   [`File`], which is a [`std::io::Read`] and [`std::io::Write`]:
//!
//! ```
//! use std::io::{Read, Write};
//! use ustrace::{FileSystem, OpenFlags};
//!
//! let tracefs = ustrace::tracefs();
//! let mut clock = tracefs.open_file("trace_clock", OpenFlags::TRUNCATE)?;
//! write!(clock, "global")?;
//! drop(clock);
//! let mut listing = String::new();
//! tracefs.open_file("trace_clock", OpenFlags::READ)?.read_to_string(&mut listing)?;
//! assert!(listing.contains("[global]"));
//! # tracefs.write_file("trace_clock", "local")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - **Serve** the same tree to shells: call [`serve()`], or start the program with
//!   `USTRACE_SERVE=1` in its environment. Then `ustrace ps` lists the process and
//!   `ustrace mount -p PID DIR` mounts its tracefs (FUSE), where `echo 1 >
//!   DIR/events/kv/get/enable` and `cat DIR/trace_pipe` work as on the kernel.
//!
//! Errors are the kernel's errno for the same mistake ([`Errno`]); where the kernel logs a
//! reason, `error_log` has it.
//!
//! # The data path
//!
//! From a call site to a reader (see `ARCHITECTURE.md` for the whole picture):
//!
//! ```text
//! call site ─[off: a patched NOP]─> nothing
//!    │ on
//!    ▼
//! tracepoint probes (RCU array) ─> event file: soft-disabled? ─> reserve in the per-CPU
//! ring buffer ─> write fields ─> commit ─> readers: trace, trace_pipe, trace_pipe_raw
//! ```
//!
//! - [`tracepoint`](mod@tracepoint): `declare_tracepoint!`, probes, `synchronize_unregister`.
//! - [`event`]: `trace_event!`, fields, the registry of events and their formats.
//! - [`trace`](mod@trace): instances and their per-event state.
//! - [`tracefs`](mod@tracefs): the file tree, as the kernel's `/sys/kernel/tracing`.
//! - [`output`]: kernel-identical text output.
//! - [`dynevent`]: `dynamic_events` (fprobes, raw tracepoint and event probes).
//! - [`synth`]: synthetic events (`synthetic_events`, `s:` in `dynamic_events`, and
//!   the in-process API to create and record them).

#![warn(missing_docs)]

pub mod buffers;
pub mod copies;
pub mod cpumask;
pub mod dynevent;
pub mod dynevent_cmd;
pub mod event;
pub mod event_file;
pub mod filter;
pub mod ftrace;
pub mod hist;
pub mod hist_inter;
pub mod marker;
pub mod options;
pub mod output;
pub mod rcu;
pub mod runtime_event;
pub mod set_event;
pub mod setup;
pub mod snapshot;
pub mod stage;
pub mod synth;
pub mod thread;
pub mod trace;
pub mod tracefs;
pub mod tracepoint;
pub mod trigger;

pub use event::FixedStr;
pub use tracefs::{tracefs, TraceFs};
pub use ustrace_ctl::vfs::{
    DirEntry, Errno, File, FileKind, FileSystem, Lines, OpenFile, OpenFlags, Stat,
};

/// Serves this process's tracefs on its control socket (`docs/ctl-protocol.md`), on a
/// thread of its own, until the process exits; `ustrace ps` then lists the process and
/// `ustrace mount -p PID DIR` mounts its tracefs. Calling it again is a no-op.
pub fn serve() -> std::io::Result<std::path::PathBuf> {
    use std::sync::Mutex;
    static SERVER: Mutex<Option<ustrace_ctl::server::ServerHandle>> = Mutex::new(None);
    let mut server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(handle) = server.as_ref() {
        return Ok(handle.socket_path().to_path_buf());
    }
    // A tracefs whose top-level buffer cannot be had is an error here, not a panic in the
    // thread that answers the first client.
    trace::try_tracing()?;
    let handle = ustrace_ctl::server::serve(std::sync::Arc::new(TraceFs))?;
    let path = handle.socket_path().to_path_buf();
    *server = Some(handle);
    Ok(path)
}

/// At program start, before `main`: applies `USTRACE_SETUP` and `USTRACE_EVENTS` (see
/// [`setup`]), then serves when `USTRACE_SERVE=1`, for programs that cannot add the call
/// to [`serve`]. Setup comes first so a client never sees the tree half set up. Only the
/// copy [`copies::elected`] names acts.
extern "C" fn serve_if_asked() {
    // One ustrace per process: the preload agent's copy starts from the agent's own
    // constructor, and a copy that is not elected leaves everything to the one that is.
    if copies::in_agent() || !copies::elected() {
        return;
    }
    if std::env::var_os("USTRACE_SETUP").is_some() || std::env::var_os("USTRACE_EVENTS").is_some() {
        setup::from_env();
    }
    if std::env::var_os("USTRACE_SERVE").is_some() {
        if let Err(e) = ustrace_ctl::server::serve_from_env(|| std::sync::Arc::new(TraceFs)) {
            eprintln!("ustrace: USTRACE_SERVE is set but serving failed: {e}");
        }
    }
}

#[used]
#[link_section = ".init_array"]
static SERVE_IF_ASKED: extern "C" fn() = serve_if_asked;

#[doc(hidden)]
pub mod __private {
    pub use linkme;
    pub use ustrace_fprobe::static_branch_unlikely;
}
