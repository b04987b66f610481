//! `ustrace record`: run a program (or attach to one that serves) and save its trace to a
//! trace.dat file, as `trace-cmd record` does for the kernel.
//!
//! ```text
//! ustrace record -F 'work*' -e kv -f 'hit == 0' -o trace.dat -- ./prog args
//!   1. flags  -> a setup file (record/plan.rs)
//!   2. spawn  LD_PRELOAD=libustrace_agent.so USTRACE_SETUP=file ./prog
//!             the agent applies the setup and serves, then waits on a pipe
//!   3. attach control socket: event formats, saved_cmdlines ...; the buffers' shared
//!             memory files through /proc/PID/fd, mapped read-only (record/drain.rs)
//!   4. release the pipe: `main` runs
//!   5. drain  complete pages copied out of the mappings into the file, from this
//!             process only: the target's threads do nothing for the recording
//!   6. end    the target exits (however: the mappings outlive it) -> the pages still
//!             in its buffers, the partly filled ones too, then counters, then the file
//! ```
//!
//! `record -P PID` does 3, 5 and 6 for a process that already serves, with the setup
//! written over its control socket; Ctrl-C ends it.

mod drain;
pub mod plan;
mod sink;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ustrace_ctl::client::Client;

/// The fd the agent waits on before letting `main` run (see the agent's `USTRACE_AGENT_SYNC`).
const SYNC_FD: i32 = 599;

#[derive(clap::Args)]
#[command(trailing_var_arg = true)]
pub struct RecordArgs {
    /// Enable an event: SYS, SYS:EVENT or all (repeatable); `-f` and `-R` after it apply to it.
    #[arg(short = 'e', long = "event", value_name = "SYS[:EVENT]")]
    pub events: Vec<String>,
    /// A filter for the `-e` before it (the kernel's filter syntax).
    #[arg(short = 'f', long = "filter", value_name = "FILTER")]
    pub filters: Vec<String>,
    /// A trigger for the `-e` before it (`traceoff`, `stacktrace`, `hist:...`).
    #[arg(short = 'R', long = "trigger", value_name = "TRIGGER")]
    pub triggers: Vec<String>,
    /// A `dynamic_events` line, e.g. 'f:my/ent work a=$arg1' (repeatable); its group is enabled.
    #[arg(long = "probe", value_name = "LINE")]
    pub probes: Vec<String>,
    /// Entry and exit fprobes (group `funcs`) on the program's functions matching a glob.
    #[arg(short = 'F', long = "funcs", value_name = "GLOB")]
    pub funcs: Vec<String>,
    /// A tracer to run (`function`, `function_graph`), as trace-cmd's -p; with it, -F and
    /// -l name the functions it traces (set_ftrace_filter), every function when none.
    #[arg(short = 'p', long = "plugin", value_name = "TRACER")]
    pub plugin: Option<String>,
    /// set_ftrace_filter words for -p (trace-cmd's -l), repeatable.
    #[arg(short = 'l', long = "ftrace-filter", value_name = "GLOB")]
    pub ftrace_filter: Vec<String>,
    /// The output file.
    #[arg(
        short = 'o',
        long = "output",
        value_name = "FILE",
        default_value = "trace.dat"
    )]
    pub output: PathBuf,
    /// Per-CPU buffer size in KiB (`buffer_size_kb`).
    #[arg(short = 'b', long = "buffer-kb", value_name = "KB")]
    pub buffer_kb: Option<u64>,
    /// The trace clock (`trace_clock`): local, global, mono, ...
    #[arg(short = 'C', long = "clock", value_name = "CLOCK")]
    pub clock: Option<String>,
    /// Record a process that already serves its tracefs (until it exits or Ctrl-C).
    #[arg(
        short = 'P',
        long = "pid",
        value_name = "PID",
        conflicts_with = "command"
    )]
    pub pid: Option<u32>,
    /// The agent to preload (default: libustrace_agent.so next to this program, or
    /// $USTRACE_AGENT).
    #[arg(long = "agent", value_name = "SO")]
    pub agent: Option<PathBuf>,
    /// Follow the target's children: `fork`, `exec` or `fork,exec`.
    #[arg(long = "follow", value_name = "WHAT")]
    pub follow: Option<String>,
    /// Print no progress line and no summary.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// The program and its arguments.
    #[arg(value_name = "CMD", allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

/// `ustrace record`. Returns the exit status for ustrace itself: the command's own (128 plus
/// the signal's number when a signal ended it, as a shell reports it), so a script that
/// records a failing command still sees it fail; 0 for `-P`.
pub fn run(args: RecordArgs) -> Result<u8, String> {
    // -f and -R bind to the -e before them, which clap's per-flag lists forget: read the
    // order from the command line itself.
    let raw: Vec<String> = std::env::args()
        .skip_while(|a| a != "record")
        .skip(1)
        .collect();
    let plan = plan::from_args(&raw)?;
    if plan.events.len() != args.events.len() {
        return Err("could not match -e/-f/-R in order; write each as `-e VALUE`".into());
    }
    let opts = drain::Options {
        output: args.output.clone(),
        progress: !args.quiet && is_tty(2),
        summary: !args.quiet,
    };
    if let Some(pid) = args.pid {
        let funcs = match std::fs::read_link(format!("/proc/{pid}/exe")) {
            Ok(exe) => plan::resolve_funcs(&exe, &plan.funcs)?,
            Err(_) if plan.funcs.is_empty() => Vec::new(),
            Err(e) => return Err(format!("-F: cannot find the program of {pid}: {e}")),
        };
        let lines = plan.setup_lines(&funcs)?;
        return record_pid(pid, &lines, &opts).map(|()| 0);
    }
    if args.command.is_empty() {
        return Err("nothing to record: give a command after `--`, or -P PID".into());
    }
    let exe = find_program(&args.command[0])?;
    let funcs = plan::resolve_funcs(&exe, &plan.funcs)?;
    let lines = plan.setup_lines(&funcs)?;
    let agent = find_agent(args.agent.as_deref())?;
    record_command(&args, &agent, &lines, &opts)
}

fn is_tty(fd: i32) -> bool {
    // SAFETY: isatty only inspects the fd.
    unsafe { libc::isatty(fd) == 1 }
}

/// The program `ustrace record` runs, found as execvp(3) finds it.
fn find_program(cmd: &std::ffi::OsStr) -> Result<PathBuf, String> {
    let p = Path::new(cmd);
    if p.components().count() > 1 {
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let full = dir.join(p);
        if full.is_file() {
            return Ok(full);
        }
    }
    Err(format!("{}: command not found", p.display()))
}

/// The agent: `--agent`, `$USTRACE_AGENT`, or `libustrace_agent.so` next to `ustrace`
/// (where cargo puts both) or in `../lib`.
fn find_agent(given: Option<&Path>) -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(g) = given {
        candidates.push(g.to_path_buf());
    } else if let Some(e) = std::env::var_os("USTRACE_AGENT") {
        candidates.push(e.into());
    } else if let Ok(me) = std::env::current_exe() {
        if let Some(dir) = me.parent() {
            candidates.push(dir.join("libustrace_agent.so"));
            // `cargo test` runs binaries from target/debug/deps.
            if let Some(up) = dir.parent() {
                candidates.push(up.join("libustrace_agent.so"));
                candidates.push(up.join("lib/libustrace_agent.so"));
            }
        }
    }
    for c in candidates {
        if c.is_file() {
            return std::fs::canonicalize(&c).map_err(|e| format!("{}: {e}", c.display()));
        }
        tried.push(c.display().to_string());
    }
    Err(format!(
        "cannot find the agent (libustrace_agent.so; build it with `cargo build -p \
         ustrace-agent`, or name it with --agent); tried: {}",
        tried.join(", ")
    ))
}

/// A private directory for the setup file and the agent's error file, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir, String> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        for n in 0..1000u32 {
            let dir = base.join(format!("ustrace-record-{}-{n}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => return Ok(TempDir(dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
            }
        }
        Err("cannot create a temporary directory".into())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn record_command(
    args: &RecordArgs,
    agent: &Path,
    lines: &[String],
    opts: &drain::Options,
) -> Result<u8, String> {
    let tmp = TempDir::new()?;
    let setup = tmp.0.join("setup");
    let errors = tmp.0.join("errors");
    let mut text = String::from("# written by ustrace record\n");
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    std::fs::write(&setup, text).map_err(|e| format!("{}: {e}", setup.display()))?;

    let mut preload = agent.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD") {
        if !old.is_empty() {
            preload.push(":");
            preload.push(old);
        }
    }
    let mut fds = [0i32; 2];
    // SAFETY: fds points at two ints, as pipe2 needs.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    let (sync_rx, sync_tx) = (fds[0], fds[1]);
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env("USTRACE_SETUP", &setup)
        .env("USTRACE_SERVE", "1")
        .env("USTRACE_AGENT_ERRORS", &errors)
        .env("USTRACE_AGENT_SYNC", SYNC_FD.to_string());
    if let Some(f) = &args.follow {
        cmd.env("USTRACE_AGENT_FOLLOW", f);
    }
    // SAFETY: between fork and exec only async-signal-safe calls: dup2 gives the child
    // the pipe's read end at SYNC_FD without close-on-exec (the agent closes it).
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(sync_rx, SYNC_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    // SAFETY: our end of the pipe; the child has its copy.
    unsafe { libc::close(sync_rx) };
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            // SAFETY: our fd.
            unsafe { libc::close(sync_tx) };
            return Err(format!(
                "cannot run {}: {e}",
                args.command[0].to_string_lossy()
            ));
        }
    };
    let pid = child.id();
    let release = move || {
        // SAFETY: writing one byte to, then closing, our pipe end (once: the closure is
        // called at most once per path below).
        unsafe {
            libc::write(sync_tx, b"g".as_ptr().cast(), 1);
            libc::close(sync_tx);
        }
    };

    // The agent serves before `main`, then waits for us.
    let start = Instant::now();
    let mut client = loop {
        if let Ok(socket) = ustrace_ctl::discover::find_socket(pid) {
            if let Ok(c) = Client::connect_path(&socket) {
                break c;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            release();
            let why = std::fs::read_to_string(&errors).unwrap_or_default();
            return Err(format!(
                "{} exited ({status}) before it served its tracefs: is it dynamically \
                 linked (the agent needs LD_PRELOAD)?{}",
                args.command[0].to_string_lossy(),
                if why.is_empty() {
                    String::new()
                } else {
                    format!("\n{why}")
                }
            ));
        }
        if start.elapsed() > Duration::from_secs(30) {
            release();
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{pid} did not serve its tracefs within 30 s"));
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let failed = std::fs::read_to_string(&errors).unwrap_or_default();
    if !failed.is_empty() {
        // The setup went wrong: recording would not give what was asked.
        let _ = child.kill();
        release();
        let _ = child.wait();
        return Err(format!(
            "the setup failed in the target:\n{}",
            failed.trim_end()
        ));
    }
    if opts.summary {
        say_unpatched(&mut client, lines);
    }
    let session = drain::Session::attach(pid, client, opts);
    // Whatever happened, `main` may now run (a failed attach ends the target below).
    release();
    let mut session = match session {
        Ok(s) => s,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let status = session.run(drain::Until::Child(&mut child))?;
    session.finish(status.map(|s| describe_status(&s)))?;
    Ok(status.map_or(0, |s| crate::exec::shell_status(&s)))
}

/// With a function tracer in the setup, says which of the functions it selects could not be
/// patched (the target's `unpatchable_functions`): named when few, counted when many, so a
/// function that records nothing is never a silent surprise.
fn say_unpatched(client: &mut Client, lines: &[String]) {
    let tracer = lines.iter().any(|l| {
        l.strip_prefix("current_tracer ")
            .is_some_and(|t| t.trim() != "nop")
    });
    if !tracer {
        return;
    }
    let Ok(text) = client.read_file("unpatchable_functions") else {
        return;
    };
    let text = String::from_utf8_lossy(&text);
    let refused: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    match refused.len() {
        0 => {}
        n @ 1..=8 => {
            eprintln!(
                "ustrace record: {n} selected function(s) cannot be patched and record nothing:"
            );
            for l in refused {
                let (name, why) = l.split_once('\t').unwrap_or((l, ""));
                eprintln!("  {name}: {why}");
            }
        }
        n => eprintln!(
            "ustrace record: {n} selected functions cannot be patched and record nothing \
             (the tracer's own code, the C library's notrace list, prologues that cannot be \
             moved); the target's unpatchable_functions lists each with the reason"
        ),
    }
}

fn describe_status(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!(
            "killed by signal {s}{}",
            if status.core_dumped() {
                " (core dumped)"
            } else {
                ""
            }
        ),
        _ => status.to_string(),
    }
}

fn record_pid(pid: u32, lines: &[String], opts: &drain::Options) -> Result<(), String> {
    let socket = ustrace_ctl::discover::find_socket(pid)
        .map_err(|e| format!("process {pid} does not serve a tracefs: {e}"))?;
    let mut client = Client::connect_path(&socket).map_err(|e| e.to_string())?;
    for (n, line) in lines.iter().enumerate() {
        apply_line(&mut client, line).map_err(|e| format!("setup line {}: {line}: {e}", n + 1))?;
    }
    if opts.summary {
        say_unpatched(&mut client, lines);
    }
    let mut session = drain::Session::attach(pid, client, opts)?;
    drain::stop_on_ctrl_c();
    session.run(drain::Until::Gone)?;
    session.finish(None)
}

/// One setup line written over the control socket, as the agent would apply it.
fn apply_line(client: &mut Client, line: &str) -> Result<(), String> {
    use ustrace::setup::{parse_line, Command};
    match parse_line(line) {
        None => Ok(()),
        Some(Command::Mkdir(path)) => client.mkdir(path).map_err(|e| e.to_string()),
        Some(Command::Write {
            path,
            value,
            append,
        }) => client
            .write_file(path, format!("{value}\n").as_bytes(), append)
            .map(|_| ())
            .map_err(|e| e.to_string()),
    }
}
