//! Open-file types shared by the control files.
//!
//! Most tracefs files are *seq files*: their text is produced when opened (a consistent
//! snapshot, as the kernel's seq_file gives), and each write(2) is parsed on its own.
//! [`TextFile`] is that. Stream files (`trace_pipe`, `trace_pipe_raw`) have their own types
//! in [`super::pipe`].

use std::time::Duration;

use ustrace_ctl::vfs::{Errno, OpenFile};

/// What a control file does with one write(2): returns the bytes it consumed.
pub type WriteFn = Box<dyn FnMut(&[u8]) -> Result<usize, Errno> + Send>;
/// What a control file does when it is closed (e.g. `free_buffer`).
pub type ReleaseFn = Box<dyn FnOnce() + Send>;

/// A file whose text is fixed at open and whose writes go to a handler.
pub struct TextFile {
    content: Vec<u8>,
    pos: usize,
    writer: Option<WriteFn>,
    on_release: Option<ReleaseFn>,
}

impl TextFile {
    /// A file that reads `content` and hands each write to `writer` (none: writes fail).
    pub fn new(content: impl Into<Vec<u8>>, writer: Option<WriteFn>) -> Self {
        TextFile {
            content: content.into(),
            pos: 0,
            writer,
            on_release: None,
        }
    }

    /// Runs `release` when the file is closed (as `free_buffer` acts on close).
    pub fn on_release(mut self, release: ReleaseFn) -> Self {
        self.on_release = Some(release);
        self
    }
}

impl OpenFile for TextFile {
    fn read(&mut self, buf: &mut [u8], _timeout: Option<Duration>) -> Result<usize, Errno> {
        let rest = &self.content[self.pos.min(self.content.len())..];
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.pos += n;
        Ok(n)
    }

    fn write(&mut self, data: &[u8]) -> Result<usize, Errno> {
        match &mut self.writer {
            Some(writer) => writer(data),
            // Root may open a read-only tracefs file for writing; the write itself fails.
            None => Err(Errno::EINVAL),
        }
    }

    fn is_stream(&self) -> bool {
        false
    }
}

impl Drop for TextFile {
    fn drop(&mut self) {
        if let Some(release) = self.on_release.take() {
            release();
        }
    }
}

/// Parses a number the way the kernel's `kstrtoul_from_user(…, 10, …)` does: decimal digits,
/// an optional leading `+`, and one optional trailing newline; nothing else.
pub fn parse_ulong(data: &[u8]) -> Result<u64, Errno> {
    let text = std::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
    let text = text.strip_suffix('\n').unwrap_or(text);
    let digits = text.strip_prefix('+').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Errno::EINVAL);
    }
    digits.parse::<u64>().map_err(|_| Errno(libc::ERANGE))
}

/// Parses a `0`/`1` switch (`enable`, `options/*`).
pub fn parse_bool(data: &[u8]) -> Result<bool, Errno> {
    match parse_ulong(data)? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Errno::EINVAL),
    }
}

/// The written text without trailing white space, as most control files take it.
pub fn text_arg(data: &[u8]) -> Result<&str, Errno> {
    std::str::from_utf8(data)
        .map(|s| s.trim_end())
        .map_err(|_| Errno::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_like_kstrtoul() {
        assert_eq!(parse_ulong(b"1\n"), Ok(1));
        assert_eq!(parse_ulong(b"01"), Ok(1));
        assert_eq!(parse_ulong(b"+5\n"), Ok(5));
        for bad in [&b"\n"[..], b" 1\n", b"0x1\n", b"1x\n", b"", b"-1", b"1\n\n"] {
            assert_eq!(parse_ulong(bad), Err(Errno::EINVAL), "{bad:?}");
        }
        assert_eq!(parse_bool(b"10\n"), Err(Errno::EINVAL));
    }
}
