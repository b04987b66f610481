//! The verbs that reach a running process's tracefs over its control socket: `ps`, `cat`,
//! `write`, `ls` and `pipe`. Each is one or a few requests on one connection (see
//! `ustrace_ctl::client`); a failure prints the tracefs's own errno text, as a shell would.

use std::io::Write;
use ustrace_ctl::client::{Client, CtlError};
use ustrace_ctl::discover;
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
    /// A path inside the tracefs, e.g. `trace` or `events/sched/sched_switch/format`.
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

pub fn ps() -> Result<(), String> {
    let served = discover::list();
    if served.is_empty() {
        eprintln!("ustrace: no process serves a tracefs (start one with USTRACE_SERVE=1)");
        return Ok(());
    }
    outln!("{:>8}  {:<16}  SOCKET", "PID", "COMMAND");
    for s in served {
        outln!("{:>8}  {:<16}  {}", s.pid, s.comm, s.socket.display());
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

pub fn write(args: WriteArgs) -> Result<(), String> {
    let mut client = connect(args.target.pid)?;
    client
        .write_file(&args.path, args.text.as_bytes(), args.append)
        .map(drop)
        .map_err(|e| format!("write {}", failed(&args.path, e)))
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
