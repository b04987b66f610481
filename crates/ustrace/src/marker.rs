//! `trace_marker`: text written by anyone becomes an `ftrace:print` event.
//!
//! The record is the kernel's `print` entry: the common header, the address of the writer
//! (`ip`), and the text, which always ends in a newline and a NUL. As on the kernel, a write
//! longer than one event can hold is cut, and the shorter count returned makes `echo` write
//! the rest as further events.

use ustrace_ctl::vfs::Errno;

use crate::event::registry::MARKER_ID;
use crate::trace::Instance;

/// The most text one marker event carries.
pub const MARKER_MAX: usize = 1024;

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
    let pid = crate::thread::current_tid(&instance.shared.record_cmd);
    let Some(mut slot) = buffer.reserve(len) else {
        // Dropped and counted by the buffer, as the kernel's full buffer would.
        return Ok(take);
    };
    let record: &mut [u8] = &mut slot;
    record[0..2].copy_from_slice(&MARKER_ID.0.to_ne_bytes());
    record[2] = 0;
    record[3] = 0;
    record[4..8].copy_from_slice(&pid.to_ne_bytes());
    let ip = write as fn(&Instance, &[u8]) -> Result<usize, Errno> as usize as u64;
    record[8..16].copy_from_slice(&ip.to_ne_bytes());
    record[16..16 + text.len()].copy_from_slice(text);
    let mut end = 16 + text.len();
    if needs_newline {
        record[end] = b'\n';
        end += 1;
    }
    record[end] = 0;
    slot.commit();
    Ok(take)
}
