//! Shared by the tests that write probe definitions into the running
//! kernel: one at a time, so that each can tell which event its own write
//! created (test binaries may run in parallel under other runners). Also
//! what the differential tests share: writing a definition to the kernel,
//! our parser's answer in the kernel's terms, and the comparison.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use ustrace_probe::{parse_command, DynCommand, ProbeEnv};

/// Holds an exclusive `flock` on a lock file until dropped (closing the
/// file releases it).
pub struct KernelLock {
    _file: File,
}

impl KernelLock {
    pub fn take() -> KernelLock {
        let f = File::create("/tmp/ustrace-probe-kernel-tests.lock").expect("create lock file");
        // SAFETY: flock on a descriptor we own; blocks until granted.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(r, 0, "flock: {}", std::io::Error::last_os_error());
        KernelLock { _file: f }
    }
}

/// What one definition line came to: accepted (the read-back line, then
/// the new event's own fields and print fmt), or rejected with the
/// kernel's errno, `error_log` message and caret column.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Accepted(String),
    Rejected {
        errno: i32,
        message: String,
        caret: Option<usize>,
    },
}

pub const TRACEFS: &str = "/sys/kernel/tracing";

/// The probe's own fields and print fmt from a kernel `format` file (after
/// the common fields' blank line).
fn format_tail(format: &str) -> String {
    let mut out = String::new();
    let mut past_common = false;
    for l in format.lines() {
        if l.is_empty() && !past_common {
            past_common = true;
            continue;
        }
        if past_common {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// The event a definition line read back from `file` names (`group/event`).
fn event_of(listed: &str) -> &str {
    listed
        .split_whitespace()
        .next()
        .unwrap_or("")
        .split_once(':')
        .map_or("", |x| x.1)
}

/// Writes `line` to the kernel's `file` (`uprobe_events`, `dynamic_events`)
/// and removes exactly what the write created.
pub fn kernel_outcome(file: &str, line: &str) -> Outcome {
    let path = format!("{TRACEFS}/{file}");
    let before = fs::read_to_string(&path).unwrap_or_default();
    let written = OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    match written {
        Ok(()) => {
            let after = fs::read_to_string(&path).unwrap_or_default();
            let created: Vec<&str> = after
                .lines()
                .filter(|l| !before.lines().any(|b| b == *l))
                .collect();
            let format = created.first().map_or(String::new(), |l| {
                fs::read_to_string(format!("{TRACEFS}/events/{}/format", event_of(l)))
                    .unwrap_or_default()
            });
            for l in &created {
                OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .and_then(|mut f| f.write_all(format!("-:{}\n", event_of(l)).as_bytes()))
                    .expect("remove the event just created");
            }
            Outcome::Accepted(format!(
                "{}\n{}",
                created.first().copied().unwrap_or(""),
                format_tail(&format)
            ))
        }
        Err(e) => {
            let log = fs::read_to_string(format!("{TRACEFS}/error_log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let command = line.split_whitespace().collect::<Vec<_>>().join(" ");
            let (mut message, mut caret) = (String::new(), None);
            let n = lines.len();
            if n >= 3 && lines[n - 2] == format!("  Command: {command}") {
                if let Some(p) = lines[n - 3].find("error: ") {
                    message = lines[n - 3][p + 7..].to_owned();
                }
                caret = lines[n - 1].find('^').map(|c| c - "  Command: ".len());
            }
            Outcome::Rejected {
                errno: e.raw_os_error().unwrap_or(0),
                message,
                caret,
            }
        }
    }
}

/// What our parser makes of `line`, in the kernel's terms.
pub fn our_outcome(line: &str, env: &dyn ProbeEnv) -> Outcome {
    match parse_command(line, env) {
        Ok(DynCommand::Create(d)) => {
            let p = d.compile(None);
            let mut tail = String::new();
            for f in p.fields() {
                // The kernel's format file prints a probe array field as
                // `u8 x[]`: its type string is `u8[4]` but the field has no
                // recorded length, so `f_show` writes empty brackets.
                let (base, dims) = match (f.c_type.starts_with("__data_loc"), f.c_type.find('[')) {
                    (false, Some(b)) => (&f.c_type[..b], "[]"),
                    _ => (&f.c_type[..], ""),
                };
                tail.push_str(&format!(
                    "\tfield:{base} {}{dims};\toffset:{};\tsize:{};\tsigned:{};\n",
                    f.name,
                    f.offset,
                    f.size,
                    u8::from(f.signed)
                ));
            }
            tail.push_str(&format!("\nprint fmt: {}\n", p.print_fmt()));
            Outcome::Accepted(format!("{}\n{tail}", d.canonical()))
        }
        Ok(other) => Outcome::Accepted(format!("{other:?}")),
        Err(e) => Outcome::Rejected {
            errno: e.errno.code(),
            message: e.message().to_owned(),
            caret: e.id.map(|_| e.caret()),
        },
    }
}

/// Each line written to the kernel's `file` and to our parser, compared.
pub struct Agreement {
    pub agree: usize,
    pub explained: usize,
    /// Kernel rejections that came with an `error_log` entry to compare.
    pub logged: usize,
    /// The unexplained disagreements, described.
    pub bad: Vec<String>,
}

/// Compares every line: acceptance and read-back, or errno, message (when
/// the kernel logged one) and caret. Disagreements on a line containing a
/// text in `explained` are reported with their reason and not counted bad.
pub fn compare(
    lines: &[String],
    file: &str,
    env: &dyn ProbeEnv,
    explained: &[(&str, &str)],
) -> Agreement {
    let mut a = Agreement {
        agree: 0,
        explained: 0,
        logged: 0,
        bad: Vec::new(),
    };
    for line in lines {
        let (k, o) = (kernel_outcome(file, line), our_outcome(line, env));
        if let Outcome::Rejected { caret: Some(_), .. } = k {
            a.logged += 1;
        }
        let same = match (&k, &o) {
            (Outcome::Accepted(a), Outcome::Accepted(b)) => a == b,
            (
                Outcome::Rejected {
                    errno: ke,
                    message: km,
                    caret: kc,
                },
                Outcome::Rejected {
                    errno: oe,
                    message: om,
                    caret: oc,
                },
            ) => ke == oe && (km.is_empty() || km == om) && (kc.is_none() || kc == oc),
            _ => false,
        };
        if same {
            a.agree += 1;
        } else if let Some((_, why)) = explained.iter().find(|(t, _)| line.contains(t)) {
            a.explained += 1;
            eprintln!("explained: {line}\n  kernel: {k:?}\n  ours:   {o:?}\n  why: {why}");
        } else {
            a.bad
                .push(format!("{line}\n  kernel: {k:?}\n  ours:   {o:?}"));
        }
    }
    a
}
