//! `libustrace_agent.so`: ustrace for a program that never heard of it.
//!
//! ```text
//! LD_PRELOAD=libustrace_agent.so ./any-program     (or: ustrace record ... -- ./any-program)
//! ```
//!
//! At load, from an `.init_array` constructor (before the program's `main`), the agent
//! brings up the tracer in the target exactly as a program that links the crate gets it
//! with `USTRACE_SERVE=1`: `USTRACE_SETUP`/`USTRACE_EVENTS` are applied (so fprobes and
//! events are on before `main` runs), then the tracefs is served on the control socket,
//! where `ustrace ps`, `mount`, `record -P` and the `dynamic_events` file reach it. Events
//! go to the shared-memory ring buffers, which `ustrace record` drains from outside.
//!
//! The target must not notice:
//! - no output: the server's messages and setup errors are dropped, or appended to the
//!   file `USTRACE_AGENT_ERRORS` names (the recorder reads it);
//! - the buffers' files take fd numbers at or above [`FD_FLOOR`], close-on-exec;
//! - signal dispositions are as the program left them (the server's socket cleanup
//!   handlers are taken back out), except SIGTRAP/SIGSEGV/SIGBUS once probes are set:
//!   code patching and fault-safe reads need them, and they pass every signal that is not
//!   theirs on to the program's handler; every thread the agent starts blocks all
//!   signals, so a signal meant for the program is never run on the tracer's threads;
//! - `exec`: the agent removes itself from `LD_PRELOAD` (and the setup variables) unless
//!   `USTRACE_AGENT_FOLLOW` contains `exec`; `fork`: the child keeps the buffers it shares
//!   with the parent but serves nothing unless `USTRACE_AGENT_FOLLOW` contains `fork`;
//! - one ustrace per process: when the program (or a library loaded before the agent)
//!   links ustrace itself, the agent does nothing and that copy serves
//!   ([`ustrace::copies`]).

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex};

use ustrace_ctl::server::{self, ServerConfig, ServerHandle};

/// The lowest fd number the agent's shared-memory files take (programs use low numbers,
/// and a daemon that closes "all" fds usually closes from 3 up to what it opened).
pub const FD_FLOOR: i32 = 600;

/// Variables that configure the agent, removed from the environment of programs the
/// target `exec`s unless exec is followed.
const OWN_VARS: [&str; 5] = [
    "USTRACE_SETUP",
    "USTRACE_EVENTS",
    "USTRACE_SERVE",
    "USTRACE_AGENT_ERRORS",
    "USTRACE_AGENT_FOLLOW",
];

#[used]
#[link_section = ".note.ustrace-agent"]
static AGENT_NOTE: ustrace::copies::AgentNote = ustrace::copies::AGENT_NOTE;

#[used]
#[link_section = ".init_array"]
static AGENT_INIT: extern "C" fn() = agent_init;

/// The server, kept for the life of the process (never dropped: a forked child must not
/// tear down what it inherited from its parent).
static SERVER: Mutex<Option<ServerHandle>> = Mutex::new(None);

/// What `USTRACE_AGENT_FOLLOW` asks for.
#[derive(Clone, Copy, Default)]
struct Follow {
    fork: bool,
    exec: bool,
}

impl Follow {
    fn from_env() -> Follow {
        let v = std::env::var("USTRACE_AGENT_FOLLOW").unwrap_or_default();
        let mut f = Follow::default();
        for word in v.split([',', ' ']) {
            match word.trim() {
                "fork" => f.fork = true,
                "exec" => f.exec = true,
                "all" | "1" => {
                    f = Follow {
                        fork: true,
                        exec: true,
                    }
                }
                _ => {}
            }
        }
        f
    }
}

static FOLLOW_FORK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn agent_init() {
    if !ustrace::copies::elected() {
        // The program has its own ustrace, which reads the same variables.
        return;
    }
    let follow = Follow::from_env();
    let errors_to = std::env::var_os("USTRACE_AGENT_ERRORS");
    let setup = std::env::var_os("USTRACE_SETUP");
    let events = std::env::var_os("USTRACE_EVENTS");
    let sync = std::env::var("USTRACE_AGENT_SYNC")
        .ok()
        .and_then(|v| v.parse::<i32>().ok());
    // The recorder's handshake is for this process only.
    set_or_unset("USTRACE_AGENT_SYNC", None);
    if !follow.exec {
        strip_env();
    }
    ustrace_ringbuf::set_fd_floor(FD_FLOOR);
    server::set_fd_floor(FD_FLOOR);
    let mut errors = Vec::new();
    with_program_signals_kept(|| {
        with_low_fds_taken(|| {
            errors = start(setup.as_deref(), events.as_deref(), errors_to.as_deref());
        })
    });
    if let Some(fd) = sync {
        wait_for_recorder(fd);
    }
    if follow.fork {
        FOLLOW_FORK.store(true, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: registers a plain extern "C" function for the child side of fork.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    }
}

/// `ustrace record` maps the buffers before `main` runs (so even a program that exits at
/// once leaves its events to the recorder): it passes a pipe at `fd`, and writes to it
/// (or closes it) once it is attached. The fd is closed here: the program never sees it.
fn wait_for_recorder(fd: i32) {
    let mut byte = 0u8;
    // SAFETY: reading one byte into a local from the fd the recorder passed, then
    // closing it; a bad fd only makes read fail.
    unsafe {
        while libc::read(fd, (&mut byte as *mut u8).cast(), 1) < 0
            && *libc::__errno_location() == libc::EINTR
        {}
        libc::close(fd);
    }
}

/// Applies the setup, reports its errors (to the file `errors_to` names), then serves;
/// the errors, one line each. The recorder reads the file once it reaches the socket, so
/// the file is complete before the socket exists.
fn start(setup: Option<&OsStr>, events: Option<&OsStr>, errors_to: Option<&OsStr>) -> Vec<String> {
    let mut errors = Vec::new();
    if let Err(e) = ustrace::trace::try_tracing() {
        errors.push(format!("cannot set up tracing: {e}"));
        report(errors_to, &errors);
        return errors;
    }
    if let Some(file) = setup {
        let name = file.to_string_lossy().into_owned();
        match std::fs::read_to_string(file) {
            Ok(text) => errors.extend(ustrace::setup::run_setup(&name, &text)),
            Err(e) => errors.push(format!("USTRACE_SETUP: cannot read {name}: {e}")),
        }
    }
    if let Some(list) = events {
        match list.to_str() {
            Some(list) => errors.extend(ustrace::setup::run_events(list)),
            None => errors.push("USTRACE_EVENTS: not valid UTF-8".into()),
        }
    }
    if !errors.is_empty() {
        report(errors_to, &errors);
    }
    if let Err(e) = serve() {
        let e = format!("cannot serve the tracefs: {e}");
        report(errors_to, std::slice::from_ref(&e));
        errors.push(e);
    }
    errors
}

fn serve() -> std::io::Result<()> {
    let config = ServerConfig {
        // The target's stderr is the target's.
        log: Arc::new(|_: &str| {}),
        ..ServerConfig::default()
    };
    let handle = server::serve_with(Arc::new(ustrace::TraceFs), config)?;
    let mut slot = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(inherited) = slot.take() {
        // A forked child's copy of the parent's server: its threads are not here, and
        // dropping it would remove the parent's socket.
        std::mem::forget(inherited);
    }
    *slot = Some(handle);
    Ok(())
}

extern "C" fn after_fork_in_child() {
    if FOLLOW_FORK.load(std::sync::atomic::Ordering::Relaxed) {
        with_program_signals_kept(|| {
            let _ = serve();
        });
    }
}

/// The signals the tracer handles itself: SIGTRAP finishes a code patch another thread ran
/// into, SIGSEGV/SIGBUS make its memory reads fault-safe. Never blocked on its threads.
const TRACER_SIGNALS: [i32; 3] = [libc::SIGTRAP, libc::SIGSEGV, libc::SIGBUS];

/// Runs `f` with every signal but [`TRACER_SIGNALS`] blocked (threads it starts inherit the
/// mask, so none of them ever runs the program's handlers), then puts back the program's mask and any
/// signal disposition `f` changed (the server's socket cleanup on SIGINT/SIGTERM/SIGHUP),
/// except the tracer's chained SIGTRAP/SIGSEGV/SIGBUS handlers, without which patching
/// code and fault-safe reads would kill the program.
fn with_program_signals_kept(f: impl FnOnce()) {
    const NSIG: usize = 65;
    // SAFETY: plain libc calls with valid pointers to zeroed sigset/sigaction values.
    unsafe {
        let mut saved: Vec<libc::sigaction> = vec![std::mem::zeroed(); NSIG];
        let mut valid = [false; NSIG];
        for sig in 1..NSIG {
            valid[sig] = libc::sigaction(sig as i32, std::ptr::null(), &mut saved[sig]) == 0;
        }
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        // Except the tracer's own synchronous signals: a thread that runs into a code patch
        // in progress (the setup's own thread, patching every function, runs the libc
        // functions it patches) must take its SIGTRAP, and a blocked trap or fault is not
        // deferred but kills the process.
        for sig in TRACER_SIGNALS {
            libc::sigdelset(&mut all, sig);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        f();
        for sig in 1..NSIG {
            // The tracer's own: SIGTRAP finishes a code patch another thread ran into,
            // SIGSEGV/SIGBUS make its memory reads fault-safe. Each hands signals that are
            // not its own to the handler the program had.
            if !valid[sig] || TRACER_SIGNALS.contains(&(sig as i32)) {
                continue;
            }
            let mut now: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig as i32, std::ptr::null(), &mut now) == 0
                && (now.sa_sigaction != saved[sig].sa_sigaction
                    || now.sa_flags != saved[sig].sa_flags)
            {
                libc::sigaction(sig as i32, &saved[sig], std::ptr::null_mut());
            }
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// Runs `f` with every free fd number below the floor taken by a placeholder, so that
/// whatever the tracer opens while it starts (buffers, socket, `/proc/self/mem` for code
/// patching, ...) lands at or above the floor, whichever crate opens it; then frees
/// the placeholders. Only in the constructor: no other thread of the program exists yet
/// that could want one of those numbers meanwhile.
fn with_low_fds_taken(f: impl FnOnce()) {
    // SAFETY: plain fd syscalls on fds this function opens and closes itself.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        let soft = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur as i64
        } else {
            0
        };
        // Leave room above the floor for what the tracer opens.
        let floor = i64::from(FD_FLOOR).min(soft - 128);
        let base = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        let mut taken = Vec::new();
        if base >= 0 {
            taken.push(base);
        }
        if base >= 0 && floor > 0 {
            loop {
                let fd = libc::fcntl(base, libc::F_DUPFD_CLOEXEC, 0);
                if fd < 0 {
                    break;
                }
                if i64::from(fd) >= floor {
                    libc::close(fd);
                    break;
                }
                taken.push(fd);
            }
        }
        f();
        for fd in taken {
            libc::close(fd);
        }
    }
}

/// Takes the agent out of `LD_PRELOAD` and its variables out of the environment, so
/// programs the target runs start without it. Runs in the constructor, before the
/// program or any thread of ours could read the environment.
fn strip_env() {
    if let Some(preload) = std::env::var_os("LD_PRELOAD") {
        let kept: Vec<&[u8]> = preload
            .as_bytes()
            .split(|b| *b == b':' || *b == b' ')
            .filter(|entry| !entry.is_empty() && !is_me(entry))
            .collect();
        let joined = OsStr::from_bytes(&kept.join(&b':')).to_os_string();
        set_or_unset("LD_PRELOAD", (!joined.is_empty()).then_some(&joined));
    }
    for var in OWN_VARS {
        set_or_unset(var, None);
    }
}

/// Whether an `LD_PRELOAD` entry names this object.
fn is_me(entry: &[u8]) -> bool {
    let name = entry.rsplit(|b| *b == b'/').next().unwrap_or(entry);
    name.starts_with(b"libustrace_agent")
}

fn set_or_unset(var: &str, value: Option<&OsString>) {
    let Ok(cvar) = CString::new(var) else { return };
    // SAFETY: the constructor runs before main and before any thread exists, so nothing
    // reads the environment concurrently; the strings are NUL-terminated.
    unsafe {
        match value {
            Some(v) => {
                if let Ok(cv) = CString::new(v.as_bytes()) {
                    libc::setenv(cvar.as_ptr(), cv.as_ptr(), 1);
                }
            }
            None => {
                libc::unsetenv(cvar.as_ptr());
            }
        }
    }
}

/// Appends the errors to the file `USTRACE_AGENT_ERRORS` named, if any.
fn report(to: Option<&OsStr>, errors: &[String]) {
    let Some(path) = to else { return };
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path);
    if let Ok(mut file) = file {
        let mut text = String::new();
        for e in errors {
            text.push_str("ustrace-agent: ");
            text.push_str(e);
            text.push('\n');
        }
        let _ = file.write_all(text.as_bytes());
    }
}

/// The agent's version, for `ustrace record` to check it loaded the agent it built.
#[no_mangle]
pub extern "C" fn ustrace_agent_version() -> *const libc::c_char {
    static VERSION: &CStr = c"ustrace-agent 0.1.0";
    VERSION.as_ptr()
}
