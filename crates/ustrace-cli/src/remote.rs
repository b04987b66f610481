//! The verbs that reach a running process's tracefs over its control socket: `ps`, `cat`,
//! `write`, `ls` and `pipe`. Each is one or a few requests on one connection (see
//! `ustrace_ctl::client`); a failure prints the tracefs's own errno text, as a shell would.

use std::io::Write;
use ustrace_ctl::client::{Client, CtlError};
use ustrace_ctl::proto::MAX_DATA;
use ustrace_ctl::vfs::{FileKind, OpenFlags};

#[derive(clap::Args)]
pub struct PidArg {
    /// The process whose tracefs to use (see `ustrace ps`).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pid: u32,
}

#[derive(clap::Args)]
pub struct CatArgs {
    #[command(flatten)]
    pub target: PidArg,
    /// A path inside the tracefs, e.g. `trace` or `events/ftrace/print/format`.
    pub path: String,
}

#[derive(clap::Args)]
pub struct WriteArgs {
    #[command(flatten)]
    pub target: PidArg,
    /// A path inside the tracefs.
    pub path: String,
    /// What to write, as one write(2); no newline is added.
    pub text: String,
    /// Add to the file (`>>`) instead of replacing it (`>`).
    #[arg(short, long)]
    pub append: bool,
}

#[derive(clap::Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub target: PidArg,
    /// A directory inside the tracefs (default: the top).
    #[arg(default_value = "")]
    pub path: String,
}

#[derive(clap::Args)]
pub struct PipeArgs {
    #[command(flatten)]
    pub target: PidArg,
    /// Read the pipe of this instance (`instances/NAME/trace_pipe`).
    #[arg(short, long, value_name = "NAME")]
    pub instance: Option<String>,
}

fn connect(pid: u32) -> Result<Client, String> {
    Client::connect(pid).map_err(|e| e.to_string())
}

fn failed(path: &str, e: CtlError) -> String {
    match e {
        CtlError::Remote { errno, .. } => format!("{path}: {errno}"),
        other => format!("{path}: {other}"),
    }
}

#[derive(clap::Args)]
pub struct PsArgs {
    /// Show each process's control socket too.
    #[arg(short, long)]
    pub sockets: bool,
}

/// The name of user `uid`, or the number when it has none.
fn user_name(uid: u32) -> String {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: passwd is plain data; all zeroes is a valid value.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and buf's length is passed with it.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return uid.to_string();
    }
    // SAFETY: on success pw_name points at a NUL-terminated string inside buf.
    unsafe { std::ffi::CStr::from_ptr(entry.pw_name) }
        .to_string_lossy()
        .into_owned()
}

/// The full command line of `pid` as `ps` shows it, or `[comm]` when it cannot be read.
fn command_line(pid: u32, comm: &str) -> String {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(raw) if !raw.is_empty() => {
            let args: Vec<String> = raw
                .strip_suffix(&[0])
                .unwrap_or(&raw)
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.join(" ")
        }
        _ => format!("[{comm}]"),
    }
}

/// How many events the process declares and how many are enabled, counted from its
/// `available_events` and `set_event` (one event a line); `-` for what it will not tell.
fn event_counts(socket: &std::path::Path) -> (String, String) {
    let Ok(mut client) = Client::connect_path(socket) else {
        return ("-".into(), "-".into());
    };
    client.set_timeout(Some(std::time::Duration::from_secs(2)));
    let mut count = |path: &str| {
        client
            .read_file(path)
            .map(|text| {
                String::from_utf8_lossy(&text)
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .count()
                    .to_string()
            })
            .unwrap_or_else(|_| "-".into())
    };
    (count("available_events"), count("set_event"))
}

pub fn ps(args: PsArgs) -> Result<(), String> {
    let served = ustrace_ctl::client::list();
    if served.is_empty() {
        eprintln!("ustrace: no process serves a tracefs (start one with USTRACE_SERVE=1)");
        return Ok(());
    }
    // The socket column is as wide as its longest path, so COMMAND lines up after it.
    let width = served
        .iter()
        .map(|s| s.socket.display().to_string().len())
        .max()
        .unwrap_or(0);
    let socket_header = if args.sockets {
        format!("{:<width$}  ", "SOCKET")
    } else {
        String::new()
    };
    outln!(
        "{:>8} {:<10} {:>6} {:>7}  {socket_header}COMMAND",
        "PID",
        "USER",
        "EVENTS",
        "ENABLED"
    );
    for s in served {
        let user = std::fs::metadata(format!("/proc/{}", s.pid))
            .map(|m| user_name(std::os::unix::fs::MetadataExt::uid(&m)))
            .unwrap_or_else(|_| "?".into());
        let (events, enabled) = event_counts(&s.socket);
        let socket = if args.sockets {
            format!("{:<width$}  ", s.socket.display().to_string())
        } else {
            String::new()
        };
        outln!(
            "{:>8} {:<10} {:>6} {:>7}  {socket}{}",
            s.pid,
            user,
            events,
            enabled,
            command_line(s.pid, &s.comm)
        );
    }
    Ok(())
}

/// Copies a file to stdout; a stream file (`trace_pipe`) is copied until interrupted.
fn copy_out(client: &mut Client, path: &str) -> Result<(), String> {
    let file = client
        .open(path, OpenFlags::READ)
        .map_err(|e| failed(path, e))?;
    let mut out = std::io::stdout().lock();
    loop {
        let chunk = client
            .read(file.handle, MAX_DATA as u32, None)
            .map_err(|e| failed(path, e))?;
        if chunk.is_empty() {
            break;
        }
        if let Err(e) = out.write_all(&chunk).and_then(|()| out.flush()) {
            // `ustrace pipe | head` closing early is not an error.
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(format!("stdout: {e}"));
        }
    }
    let _ = client.close(file.handle);
    Ok(())
}

pub fn cat(args: CatArgs) -> Result<(), String> {
    let mut client = connect(args.target.pid)?;
    copy_out(&mut client, &args.path)
}

/// The `error_log` that a write to `path` reports into: its instance's, or the top one.
fn error_log_of(path: &str) -> String {
    let path = path.trim_start_matches('/');
    match path
        .strip_prefix("instances/")
        .and_then(|rest| rest.split_once('/'))
    {
        Some((instance, _)) => format!("instances/{instance}/error_log"),
        None => "error_log".to_owned(),
    }
}

/// What `after` has that `before` did not: the entries a failed write added. The log keeps
/// a bounded number of entries, so the oldest may have gone; entries are matched by their
/// first line, which carries a timestamp.
fn new_log_entries(before: &str, after: &str) -> String {
    let Some(last) = before.lines().rev().find(|l| l.starts_with('[')) else {
        return after.to_owned();
    };
    match after.find(last) {
        Some(at) => {
            // Skip the rest of that entry: its continuation lines do not start with '['.
            let rest = &after[at + last.len()..];
            let mut offset = 0;
            for line in rest.split_inclusive('\n') {
                if line.starts_with('[') {
                    break;
                }
                offset += line.len();
            }
            rest[offset..].to_owned()
        }
        None => after.to_owned(),
    }
}

pub fn write(args: WriteArgs) -> Result<(), String> {
    let mut client = connect(args.target.pid)?;
    let log = error_log_of(&args.path);
    // Files without an error_log (or a process that cannot read it) just print the errno.
    let before = client.read_file(&log).ok();
    let Err(e) = client.write_file(&args.path, args.text.as_bytes(), args.append) else {
        return Ok(());
    };
    let mut message = format!("write {}", failed(&args.path, e));
    if let Some(before) = before {
        if let Ok(after) = client.read_file(&log) {
            let added = new_log_entries(
                &String::from_utf8_lossy(&before),
                &String::from_utf8_lossy(&after),
            );
            if !added.is_empty() {
                message.push_str(&format!("\n{log}:\n{}", added.trim_end_matches('\n')));
            }
        }
    }
    Err(message)
}

pub fn ls(args: LsArgs) -> Result<(), String> {
    let mut client = connect(args.target.pid)?;
    let st = client.stat(&args.path).map_err(|e| failed(&args.path, e))?;
    if st.kind == FileKind::File {
        outln!("{}", args.path);
        return Ok(());
    }
    let mut entries = client
        .readdir(&args.path)
        .map_err(|e| failed(&args.path, e))?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        let slash = if e.kind == FileKind::Dir { "/" } else { "" };
        outln!("{}{slash}", e.name);
    }
    Ok(())
}

pub fn pipe(args: PipeArgs) -> Result<(), String> {
    let path = match &args.instance {
        Some(name) => format!("instances/{name}/trace_pipe"),
        None => "trace_pipe".to_owned(),
    };
    let mut client = connect(args.target.pid)?;
    copy_out(&mut client, &path)
}
