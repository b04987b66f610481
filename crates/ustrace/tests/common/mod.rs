//! Shared by the integration tests: reading and writing tracefs files as a shell does.
#![allow(dead_code)]

use ustrace::{Errno, FileSystem, OpenFlags};

/// The whole file, read as `cat` reads it.
pub fn read(path: &str) -> Result<String, Errno> {
    let mut file = ustrace::tracefs().open(path, OpenFlags::READ)?;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = file.read(&mut buf, None)?;
        if n == 0 {
            return Ok(String::from_utf8_lossy(&out).into_owned());
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// `echo TEXT > PATH` (without the newline unless TEXT has one).
pub fn write(path: &str, text: &str) -> Result<(), Errno> {
    let mut file = ustrace::tracefs().open(path, OpenFlags::TRUNCATE)?;
    file.write(text.as_bytes()).map(|_| ())
}

/// `echo TEXT >> PATH`.
pub fn append(path: &str, text: &str) -> Result<(), Errno> {
    let mut file = ustrace::tracefs().open(path, OpenFlags::APPEND)?;
    file.write(text.as_bytes()).map(|_| ())
}

/// The trace lines of `trace` text, headers left out.
pub fn body_lines(trace: &str) -> Vec<String> {
    trace
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(String::from)
        .collect()
}
