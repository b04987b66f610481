//! ustrace: the Linux kernel's event tracing, inside a user-space process.
//!
//! The data path, start to end (see `ARCHITECTURE.md` for the whole picture):
//!
//! ```text
//! call site ─[tracepoint off: one load]─> nothing
//!    │ on
//!    ▼
//! tracepoint probes (RCU array) ─> event file: soft-disabled? ─> reserve in the per-CPU
//! ring buffer ─> write fields ─> commit ─> readers: trace, trace_pipe, trace_pipe_raw
//! ```
//!
//! - [`tracepoint`]: `declare_tracepoint!`, probes, `synchronize_unregister`.
//! - [`event`]: `trace_event!`, fields, the registry of events and their formats.
//! - [`trace`]: instances and their per-event state.
//! - [`tracefs`]: the file tree, as the kernel's `/sys/kernel/tracing`.
//! - [`output`]: kernel-identical text output.

pub mod dynevent;
pub mod dynevent_cmd;
pub mod event;
pub mod filter;
pub mod marker;
pub mod options;
pub mod output;
pub mod rcu;
pub mod runtime_event;
pub mod set_event;
pub mod snapshot;
pub mod thread;
pub mod trace;
pub mod tracefs;
pub mod tracepoint;
pub mod trigger;

pub use event::FixedStr;
pub use tracefs::{tracefs, TraceFs};
pub use ustrace_ctl::vfs::{Errno, FileSystem, OpenFlags};

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
    let handle = ustrace_ctl::server::serve(std::sync::Arc::new(TraceFs))?;
    let path = handle.socket_path().to_path_buf();
    *server = Some(handle);
    Ok(path)
}

/// Starts serving at program start when `USTRACE_SERVE=1`, for programs that cannot add the
/// call to [`serve`].
extern "C" fn serve_if_asked() {
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
