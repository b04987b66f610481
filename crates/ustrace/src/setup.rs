//! Tracing set up from the environment before `main` runs, as the kernel's `trace_event=`
//! and `trace_options=` boot options set it up before user space exists.
//!
//! ```text
//! USTRACE_EVENTS='kv:get,net:*'    each comma-separated word is written to set_event
//! USTRACE_SETUP=/path/to/file       each line is one tracefs write (below), in order
//! ```
//!
//! A setup file has one command a line; blank lines and lines starting with `#` are
//! skipped. `VALUE` is the rest of the line, trailing white space removed, and is written
//! with a newline after it, as `echo` writes:
//!
//! ```text
//! PATH VALUE          echo VALUE > PATH     (PATH > VALUE is the same)
//! PATH >> VALUE       echo VALUE >> PATH    (dynamic_events, set_event, triggers)
//! PATH                echo > PATH           (e.g. `trace` clears the buffer)
//! mkdir PATH          mkdir PATH            (instances/NAME)
//! ```
//!
//! `PATH` is relative to the tracefs root (a leading `/sys/kernel/tracing/` is dropped, so
//! lines copied from a kernel script work). `USTRACE_SETUP` runs first, then
//! `USTRACE_EVENTS`. Nothing here aborts the program: each failing line or word is
//! reported on stderr with its place and the kernel's errno, and the rest still runs.
//!
//! It runs from the same start-up hook as `USTRACE_SERVE` (`lib.rs`); it is only control
//! (tracefs writes), so it touches no data path.

use std::fmt::Write as _;

use ustrace_ctl::vfs::{Errno, FileSystem, OpenFlags};

use crate::tracefs::TraceFs;

/// One command of a setup file.
#[derive(Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// `PATH VALUE` (`echo VALUE > PATH`) or `PATH >> VALUE` (`echo VALUE >> PATH`).
    Write {
        /// The tracefs path, relative to its root.
        path: &'a str,
        /// What is written (a newline is added, as `echo` adds one).
        value: &'a str,
        /// Whether the file is opened for appending rather than truncated.
        append: bool,
    },
    /// `mkdir PATH`: makes an instance.
    Mkdir(&'a str),
}

/// Parses one line; `None` for blank lines and comments.
pub fn parse_line(line: &str) -> Option<Command<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (first, rest) = match line.split_once(char::is_whitespace) {
        Some((first, rest)) => (first, rest.trim_start()),
        None => (line, ""),
    };
    if first == "mkdir" && !rest.is_empty() {
        return Some(Command::Mkdir(strip_root(rest)));
    }
    let path = strip_root(first);
    let (value, append) = if let Some(value) = rest.strip_prefix(">>") {
        (value, true)
    } else if let Some(value) = rest.strip_prefix('>') {
        (value, false)
    } else {
        (rest, false)
    };
    Some(Command::Write {
        path,
        value: value.trim(),
        append,
    })
}

fn strip_root(path: &str) -> &str {
    path.strip_prefix("/sys/kernel/tracing")
        .unwrap_or(path)
        .trim_start_matches('/')
}

fn run(fs: &TraceFs, command: &Command<'_>) -> Result<(), Errno> {
    match *command {
        Command::Mkdir(path) => fs.mkdir(path),
        Command::Write {
            path,
            value,
            append,
        } => {
            let flags = if append {
                OpenFlags::APPEND
            } else {
                OpenFlags::TRUNCATE
            };
            let mut file = fs.open(path, flags)?;
            file.write(format!("{value}\n").as_bytes()).map(|_| ())
        }
    }
}

/// The `error_log` of the instance a command writes in.
fn error_log_of(fs: &TraceFs, command: &Command<'_>) -> String {
    let Command::Write { path, .. } = command else {
        return String::new();
    };
    let log = match path
        .strip_prefix("instances/")
        .and_then(|p| p.split_once('/'))
    {
        Some((instance, _)) => format!("instances/{instance}/error_log"),
        None => "error_log".to_string(),
    };
    let mut text = Vec::new();
    if let Ok(mut file) = fs.open(&log, OpenFlags::READ) {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = file.read(&mut buf, None) {
            text.extend_from_slice(&buf[..n]);
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Runs every line of a setup file's text; returns the error messages (`NAME:LINE: …`).
pub fn run_setup(name: &str, text: &str) -> Vec<String> {
    let fs = TraceFs;
    let mut errors = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some(command) = parse_line(line) else {
            continue;
        };
        let log_before = error_log_of(&fs, &command);
        if let Err(e) = run(&fs, &command) {
            let target = match command {
                Command::Mkdir(path) => format!("mkdir {path}"),
                Command::Write { path, .. } => path.to_string(),
            };
            let mut message = format!("{name}:{}: {target}: {e}", n + 1);
            // Filters, triggers and dynamic events say why in error_log, as on the kernel.
            let log_after = error_log_of(&fs, &command);
            if let Some(new) = log_after.strip_prefix(log_before.as_str()) {
                for line in new.lines().filter(|l| !l.is_empty()) {
                    message.push_str("\n    ");
                    message.push_str(line);
                }
            }
            errors.push(message);
        }
    }
    errors
}

/// Enables each comma-separated `set_event` word of `USTRACE_EVENTS`; returns the errors.
pub fn run_events(list: &str) -> Vec<String> {
    let fs = TraceFs;
    let mut errors = Vec::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let result = fs
            .open("set_event", OpenFlags::APPEND)
            .and_then(|mut f| f.write(format!("{word}\n").as_bytes()));
        if let Err(e) = result {
            let why = if e == Errno::EINVAL {
                " (no such event, system or module)".to_string()
            } else {
                String::new()
            };
            errors.push(format!("USTRACE_EVENTS: {word}: {e}{why}"));
        }
    }
    errors
}

/// Applies `USTRACE_SETUP` and `USTRACE_EVENTS` if set, reporting problems on stderr.
pub(crate) fn from_env() {
    let mut errors = Vec::new();
    if let Some(file) = std::env::var_os("USTRACE_SETUP") {
        let name = file.to_string_lossy().into_owned();
        match std::fs::read_to_string(&file) {
            Ok(text) => errors.extend(run_setup(&name, &text)),
            Err(e) => errors.push(format!("USTRACE_SETUP: cannot read {name}: {e}")),
        }
    }
    if let Some(list) = std::env::var_os("USTRACE_EVENTS") {
        match list.to_str() {
            Some(list) => errors.extend(run_events(list)),
            None => errors.push("USTRACE_EVENTS: not valid UTF-8".to_string()),
        }
    }
    if !errors.is_empty() {
        let mut message = String::new();
        for error in errors {
            let _ = writeln!(message, "ustrace: {error}");
        }
        eprint!("{message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_into_commands() {
        let w = |path, value, append| {
            Some(Command::Write {
                path,
                value,
                append,
            })
        };
        assert_eq!(parse_line("  # comment"), None);
        assert_eq!(parse_line("   "), None);
        assert_eq!(
            parse_line("events/kv/get/enable 1"),
            w("events/kv/get/enable", "1", false)
        );
        assert_eq!(
            parse_line("events/kv/get/filter > latency_ns > 1000  "),
            w("events/kv/get/filter", "latency_ns > 1000", false)
        );
        assert_eq!(
            parse_line("/sys/kernel/tracing/dynamic_events >> f:g/e sym a=$arg1"),
            w("dynamic_events", "f:g/e sym a=$arg1", true)
        );
        assert_eq!(parse_line("trace"), w("trace", "", false));
        assert_eq!(
            parse_line("mkdir instances/foo"),
            Some(Command::Mkdir("instances/foo"))
        );
        assert_eq!(parse_line("mkdir"), w("mkdir", "", false));
    }
}
