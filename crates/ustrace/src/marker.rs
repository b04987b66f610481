//! `trace_marker`: text written by anyone becomes an `ftrace:print` event.
//!
//! The record is the kernel's `print` entry: the common header, the address of the writer
//! (`ip`), and the text, which always ends in a newline and a NUL. As on the kernel, a write
//! longer than one event can hold is cut, and the shorter count returned makes `echo` write
//! the rest as further events. The file cannot be read: a read fails with `EINVAL`, as the
//! kernel's (its `trace_marker` has no read operation).
//!
//! The kernel records the task that wrote. A write that comes in over the control socket
//! (`ustrace write`, or a shell's `echo` through the FUSE mount) runs on a server thread, so
//! the record names the task the server says it serves (`ustrace_ctl::server::current_caller`:
//! the socket's peer, or the task behind the FUSE write) and saves its name for
//! `saved_cmdlines`, instead of the server thread's.

use std::sync::Arc;
use std::time::Duration;

use ustrace_ctl::vfs::{Errno, OpenFile};

use crate::event::registry::MARKER_ID;
use crate::trace::Instance;

/// The most text one marker event carries.
pub const MARKER_MAX: usize = 1024;

/// The function a marker record names as its writer (its `ip`), under the kernel's name for
/// it: readers that look the address up (trace-cmd, with the trace.dat's kallsyms) then print
/// `tracing_mark_write`, as the `trace` file does. Never called.
#[no_mangle]
#[inline(never)]
pub extern "C" fn tracing_mark_write() {
    // A body of its own, so that no identical function is merged with it.
    std::hint::black_box(0x7472_6163_696e_675fu64);
}

/// Records one marker write; returns the bytes consumed.
pub fn write(instance: &Instance, data: &[u8]) -> Result<usize, Errno> {
    if !instance.options.get("markers") {
        return Err(Errno::EINVAL);
    }
    let buffer = instance.buffer();
    if !buffer.is_recording() {
        return Err(Errno::EBADF);
    }
    let take = data.len().min(MARKER_MAX);
    let text = &data[..take];
    let needs_newline = !text.ends_with(b"\n");
    let len = 16 + text.len() + usize::from(needs_newline) + 1;
    let Some(file) = instance.file(MARKER_ID) else {
        return Err(Errno::ENODEV);
    };
    let ip = tracing_mark_write as extern "C" fn() as usize as u64;
    let writer = ustrace_ctl::server::current_caller().and_then(|pid| i32::try_from(pid).ok());
    if let Some(pid) = writer {
        if instance.options.get("record-cmd") {
            // A task already gone keeps no name: its lines show `<...>`, as on the kernel.
            if let Some(comm) = comm_of(pid) {
                crate::thread::save_comm(pid, &comm);
            }
        }
    }
    // A full buffer drops the event and counts it, as the kernel's would.
    file.record_always(
        len,
        |record| {
            if let Some(pid) = writer {
                // common_pid, after the type (u16), flags and preempt count (u8 each).
                record[4..8].copy_from_slice(&pid.to_ne_bytes());
            }
            record[8..16].copy_from_slice(&ip.to_ne_bytes());
            record[16..16 + text.len()].copy_from_slice(text);
            record[16 + text.len()..].fill(0);
        },
        |record| {
            // Triggers see the text as written; the newline comes after them, as on the
            // kernel (a filter `buf == "start"` matches `printf start`, not `echo start`).
            if needs_newline {
                record[16 + text.len()] = b'\n';
            }
        },
    );
    Ok(take)
}

/// An open `trace_marker`.
pub struct MarkerFile {
    instance: Arc<Instance>,
}

impl MarkerFile {
    /// The file as opened in `instance`.
    pub fn new(instance: Arc<Instance>) -> MarkerFile {
        MarkerFile { instance }
    }
}

impl OpenFile for MarkerFile {
    fn read(&mut self, _buf: &mut [u8], _timeout: Option<Duration>) -> Result<usize, Errno> {
        Err(Errno::EINVAL)
    }

    fn write(&mut self, data: &[u8]) -> Result<usize, Errno> {
        write(&self.instance, data)
    }

    fn is_stream(&self) -> bool {
        false
    }
}

/// The name of task `pid` (a process or a thread), as `/proc` shows it.
fn comm_of(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim_end_matches('\n').to_owned())
}
