//! Serving a process's tracefs on its control socket.
//!
//! [`serve`] binds `<socket dir>/<pid>.sock` (mode 0600, in a private or sticky directory) and
//! starts one background thread that accepts connections; each accepted connection gets a
//! thread of its own that decodes requests and calls the [`FileSystem`]. Nothing here runs
//! on, waits for, or signals the traced threads: they only ever see the tracefs's own locks,
//! exactly as when a file is read in-process.
//!
//! ```text
//!   client ──connect──► accept thread ── SO_PEERCRED: uid == ours or 0? ──no──► EACCES, log
//!                            │ yes
//!                            ▼
//!                    connection thread:  frame → Request → FileSystem → Reply → frame
//!                       (handles private to the connection; dropped when it closes)
//! ```
//!
//! A stream read (`trace_pipe`) waits in slices of [`STREAM_SLICE`]: between slices the
//! connection thread checks whether the client hung up or the server is stopping, so a
//! vanished `cat` never pins a thread. Bad input (truncated frames, huge lengths, unknown
//! verbs, `..` in paths) gets an error reply; only a frame whose length cannot be trusted
//! closes the connection, since nothing after it can be parsed. A client may idle between
//! frames, but a frame it starts must be finished within [`FRAME_TIMEOUT`], or its slot is
//! taken back. One fd is kept in reserve so that a process out of fds can still accept a
//! client and tell it why it cannot be served.
//!
//! The socket goes away with the server: on drop, at normal exit (`atexit`), and when
//! SIGINT/SIGTERM/SIGHUP kill the process while their action is still the default (a handler
//! unlinks it and re-raises, so the process dies exactly as it would have).

use crate::discover;
use crate::proto::{self, FrameError, Reply, Request};
use crate::vfs::{Errno, FileSystem, OpenFile, OpenFlags};
use std::cell::Cell;
use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Setting this to `1` (or `true`, `yes`, `on`) makes [`serve_from_env`] start serving.
pub const SERVE_ENV: &str = "USTRACE_SERVE";
/// How long one wait for stream data lasts before the hang-up check.
pub const STREAM_SLICE: Duration = Duration::from_millis(100);
/// The most files one connection may hold open.
pub const MAX_HANDLES: usize = 1024;
/// How long a client may take to send the rest of a frame it started, or to take a reply
/// off the socket, before its connection is closed.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a server reports refused clients and failures.
pub type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How to serve.
#[derive(Clone)]
pub struct ServerConfig {
    /// The directory for the socket; `None`: [`discover::default_socket_dir`].
    pub socket_dir: Option<PathBuf>,
    /// The most connections served at once; more are refused with `EMFILE`.
    pub max_connections: usize,
    pub log: LogSink,
    /// See [`FRAME_TIMEOUT`]. A client idle between frames may stay connected; one that
    /// stops in the middle of a frame would otherwise hold its connection slot forever.
    pub frame_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            socket_dir: None,
            max_connections: 128,
            log: Arc::new(|msg: &str| eprintln!("ustrace: {msg}")),
            frame_timeout: FRAME_TIMEOUT,
        }
    }
}

struct Shared {
    fs: Arc<dyn FileSystem>,
    log: LogSink,
    stopping: AtomicBool,
    owner_uid: u32,
    max_connections: usize,
    frame_timeout: Duration,
    active: AtomicUsize,
    next_conn: AtomicU64,
    /// Clones of live connections, so stopping can shut them down and wake their threads.
    conns: Mutex<HashMap<u64, UnixStream>>,
}

/// A running server. Dropping it stops serving and removes the socket.
pub struct ServerHandle {
    socket: PathBuf,
    shared: Arc<Shared>,
    wake: Option<OwnedFd>,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle")
            .field("socket", &self.socket)
            .finish()
    }
}

impl ServerHandle {
    /// The socket clients connect to.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// How many client connections are being served right now.
    pub fn active_connections(&self) -> usize {
        self.shared.active.load(Ordering::Relaxed)
    }

    /// Stops serving and removes the socket (what dropping does).
    pub fn stop(self) {}
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(wake) = self.wake.take() {
            // SAFETY: writes one byte from a live buffer to a pipe fd we own.
            unsafe { libc::write(wake.as_raw_fd(), b"x".as_ptr().cast(), 1) };
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for conn in lock(&self.shared.conns).values() {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        let _ = std::fs::remove_file(&self.socket);
        remove_fallback_dir(&self.socket);
        forget_at_exit(&self.socket);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sockets to remove when the process exits normally: `(pid that bound it, path)`.
fn exit_sockets() -> &'static Mutex<Vec<(u32, PathBuf)>> {
    static LIST: OnceLock<Mutex<Vec<(u32, PathBuf)>>> = OnceLock::new();
    LIST.get_or_init(|| Mutex::new(Vec::new()))
}

extern "C" fn remove_sockets_at_exit() {
    // try_lock: a thread holding the lock while the process exits must not deadlock exit.
    if let Ok(list) = exit_sockets().try_lock() {
        let me = std::process::id();
        for (pid, path) in list.iter() {
            // A forked child inherits the list but not the socket's ownership.
            if *pid == me {
                let _ = std::fs::remove_file(path);
                remove_fallback_dir(path);
            }
        }
    }
}

/// Removes the private fallback directory `socket` was in, once it is empty (other servers of
/// this process may still have sockets there; then removing fails, harmlessly).
fn remove_fallback_dir(socket: &Path) {
    if let Some(dir) = socket.parent() {
        if discover::is_fallback_dir(dir, discover::euid()) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn remember_at_exit(path: &Path) {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        // SAFETY: registers a plain extern "C" function with no arguments; it is safe to run
        // at any time during exit.
        unsafe { libc::atexit(remove_sockets_at_exit) };
    });
    lock(exit_sockets()).push((std::process::id(), path.to_owned()));
    remember_on_signal(path);
}

fn forget_at_exit(path: &Path) {
    lock(exit_sockets()).retain(|(_, p)| p != path);
    forget_on_signal(path);
}

/// Socket paths the fatal-signal handler unlinks. A signal handler may not lock or allocate,
/// so each path is a leaked C string behind an atomic pointer; the pid that bound it guards
/// against a forked child removing its parent's socket.
const SIGNAL_SLOTS: usize = 16;
static SIGNAL_PATHS: [AtomicPtr<libc::c_char>; SIGNAL_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; SIGNAL_SLOTS];
static SIGNAL_PIDS: [AtomicU32; SIGNAL_SLOTS] = [const { AtomicU32::new(0) }; SIGNAL_SLOTS];

extern "C" fn remove_sockets_on_signal(sig: libc::c_int) {
    // SAFETY: getpid, unlink and raise are async-signal-safe; each pointer is either null or a
    // C string that is never freed.
    unsafe {
        let me = libc::getpid() as u32;
        for (path, pid) in SIGNAL_PATHS.iter().zip(&SIGNAL_PIDS) {
            let p = path.load(Ordering::SeqCst);
            if !p.is_null() && pid.load(Ordering::SeqCst) == me {
                libc::unlink(p);
            }
        }
        // SA_RESETHAND restored the default action: die of the same signal, as without us.
        libc::raise(sig);
    }
}

/// Makes SIGINT, SIGTERM and SIGHUP remove the socket before the process dies of them —
/// only where the process left the default action (die) in place, so its own handlers and
/// ignored signals are untouched, and the exit status is the one it would have had.
fn remember_on_signal(path: &Path) {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: sigaction with valid pointers; the handler only makes async-signal-safe
            // calls.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                    || old.sa_sigaction != libc::SIG_DFL
                {
                    continue;
                }
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = remove_sockets_on_signal as *const () as usize;
                new.sa_flags = libc::SA_RESETHAND;
                libc::sigemptyset(&mut new.sa_mask);
                libc::sigaction(sig, &new, std::ptr::null_mut());
            }
        }
    });
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    let raw = c.into_raw();
    for (slot, pid) in SIGNAL_PATHS.iter().zip(&SIGNAL_PIDS) {
        if slot
            .compare_exchange(
                std::ptr::null_mut(),
                raw,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
        {
            // Until this store a handler skips the slot (pid mismatch): harmless.
            pid.store(std::process::id(), Ordering::SeqCst);
            return;
        }
    }
    // All slots taken (more than 16 live servers): this one is cleaned at exit only.
    // SAFETY: raw came from CString::into_raw just above and was not shared.
    drop(unsafe { std::ffi::CString::from_raw(raw) });
}

fn forget_on_signal(path: &Path) {
    let bytes = path.as_os_str().as_encoded_bytes();
    for slot in &SIGNAL_PATHS {
        let p = slot.load(Ordering::SeqCst);
        // SAFETY: non-null slots hold C strings that are never freed.
        if !p.is_null() && unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes() == bytes {
            // The string is leaked, not freed: a handler running now on another thread may
            // still be reading it.
            let _ =
                slot.compare_exchange(p, std::ptr::null_mut(), Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

/// Makes the socket directory, or checks one that is already there. A directory we create is
/// made 0700. One that exists is used as it is — its mode is never changed, since it may be a
/// shared directory such as `/tmp` — but only if nobody else could swap our socket in it:
/// see [`discover::unsafe_dir`].
fn prepare_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent() {
        if !parent.as_os_str().is_empty() && !parent.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot create {}: {e}", dir.display()),
            ))
        }
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if let Some(why) = discover::unsafe_dir(&meta, discover::euid()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "refusing socket directory {}: it {why}, so another user could replace the \
                 socket; set {} to a directory only you can write",
                dir.display(),
                discover::SOCKET_DIR_ENV
            ),
        ));
    }
    Ok(())
}

/// A fresh private directory `/tmp/ustrace-<uid>.XXXXXX` (mode 0700, made by mkdtemp), for
/// when the default directory is unusable: another user may create `/tmp/ustrace-<uid>`
/// first, and that must not stop us serving. Discovery finds these directories by name and
/// trusts only those that are ours ([`discover::fallback_dirs`]).
fn private_fallback_dir() -> io::Result<PathBuf> {
    let template = discover::fallback_template(discover::euid());
    let mut raw = std::ffi::CString::new(template.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in temp path"))?
        .into_bytes_with_nul();
    // SAFETY: raw is a writable NUL-terminated buffer ending in XXXXXX, as mkdtemp requires;
    // mkdtemp only rewrites those six bytes.
    let made = unsafe { libc::mkdtemp(raw.as_mut_ptr().cast()) };
    if made.is_null() {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot create {}: {e}", template.display()),
        ));
    }
    raw.pop();
    Ok(PathBuf::from(std::ffi::OsString::from_vec(raw)))
}

/// Binds `dir/<pid>.sock` with mode 0600. The socket is bound under a temporary name, given
/// its mode, then renamed into place, so no client ever sees it with looser permissions.
fn bind_socket(dir: &Path) -> io::Result<(UnixListener, PathBuf)> {
    prepare_dir(dir)?;
    let pid = std::process::id();
    let path = discover::socket_name(dir, pid);
    if path.exists() {
        if UnixStream::connect(&path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "this process already serves its tracefs at {}",
                    path.display()
                ),
            ));
        }
        // Left by a killed process that had our pid.
        let _ = std::fs::remove_file(&path);
    }
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{pid}.{}.tmp",
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot bind {}: {e}", tmp.display())))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok((listener, path))
}

/// Serves `fs` on this process's control socket in the default directory.
pub fn serve(fs: Arc<dyn FileSystem>) -> io::Result<ServerHandle> {
    serve_with(fs, ServerConfig::default())
}

/// Serves `fs` as `config` says.
pub fn serve_with(fs: Arc<dyn FileSystem>, config: ServerConfig) -> io::Result<ServerHandle> {
    let chosen = config
        .socket_dir
        .clone()
        .or_else(discover::configured_socket_dir);
    let (listener, socket) = match chosen {
        // A directory someone named is used or refused, never swapped for another.
        Some(dir) => bind_socket(&dir)?,
        None => {
            let dir = discover::default_socket_dir();
            match bind_socket(&dir) {
                Ok(bound) => bound,
                Err(e) if e.kind() != io::ErrorKind::AddrInUse => {
                    let fallback = private_fallback_dir()?;
                    (config.log)(&format!("{e}; serving from {} instead", fallback.display()));
                    bind_socket(&fallback)?
                }
                Err(e) => return Err(e),
            }
        }
    };
    let result = start(fs, config, listener, socket.clone());
    if result.is_err() {
        let _ = std::fs::remove_file(&socket);
    }
    result
}

/// The lowest fd number the server's own files take (0: wherever the kernel puts them).
static FD_FLOOR: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Makes servers started from now on keep their socket, wake pipe, reserve fd and
/// connections at fd numbers at or above `floor` where the limit on open files allows —
/// for the preload agent, whose target must not meet the tracer among its own low fds.
pub fn set_fd_floor(floor: i32) {
    FD_FLOOR.store(floor, Ordering::Relaxed);
}

/// `fd` moved to the fd floor (close-on-exec), if one is set and there is room above it.
fn above_floor<T: From<OwnedFd> + Into<OwnedFd>>(file: T) -> T {
    let fd: OwnedFd = file.into();
    let floor = FD_FLOOR.load(Ordering::Relaxed);
    if floor <= 0 || fd.as_raw_fd() >= floor {
        return T::from(fd);
    }
    // SAFETY: duplicating an fd we own; the copy is ours alone.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor) };
    if high < 0 {
        return T::from(fd);
    }
    // SAFETY: `high` was just returned by fcntl and nothing else owns it.
    T::from(unsafe { OwnedFd::from_raw_fd(high) })
}

fn start(
    fs: Arc<dyn FileSystem>,
    config: ServerConfig,
    listener: UnixListener,
    socket: PathBuf,
) -> io::Result<ServerHandle> {
    let listener = above_floor(listener);
    listener.set_nonblocking(true)?;
    let mut fds = [0i32; 2];
    // SAFETY: fds points at two writable ints, as pipe2 requires.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both fds are open and now owned by nobody else.
    let (wake_rx, wake_tx) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let (wake_rx, wake_tx) = (above_floor(wake_rx), above_floor(wake_tx));
    let shared = Arc::new(Shared {
        fs,
        log: config.log,
        stopping: AtomicBool::new(false),
        owner_uid: discover::euid(),
        max_connections: config.max_connections,
        frame_timeout: config.frame_timeout,
        active: AtomicUsize::new(0),
        next_conn: AtomicU64::new(0),
        conns: Mutex::new(HashMap::new()),
    });
    // Taken before serving starts, so it is there however soon the process runs out.
    let reserve = open_reserve();
    let accept = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("ustrace-ctl".into())
            .spawn(move || accept_loop(&shared, &listener, &wake_rx, reserve))?
    };
    remember_at_exit(&socket);
    Ok(ServerHandle {
        socket,
        shared,
        wake: Some(wake_tx),
        accept: Some(accept),
    })
}

/// An fd held back for the moment the process runs out of them: closing it makes room to
/// accept one waiting client and tell it why it cannot be served. Without it the client is
/// never accepted and waits, unanswered, until it gives up.
fn open_reserve() -> Option<OwnedFd> {
    std::fs::File::open("/dev/null")
        .ok()
        .map(|f| above_floor(OwnedFd::from(f)))
}

fn out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

fn accept_loop(
    shared: &Arc<Shared>,
    listener: &UnixListener,
    wake: &OwnedFd,
    mut reserve: Option<OwnedFd>,
) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of two pollfd structs for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        if n < 0 {
            continue; // EINTR
        }
        match listener.accept() {
            Ok((stream, _)) => admit(shared, above_floor(stream)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if out_of_fds(&e) && reserve.is_some() => {
                drop(reserve.take());
                if let Ok((stream, _)) = listener.accept() {
                    let msg = if e.raw_os_error() == Some(libc::ENFILE) {
                        "the system is out of file descriptors (fs.file-max); the traced \
                         process cannot serve this connection"
                            .to_owned()
                    } else {
                        format!(
                            "process {} has used all the file descriptors its RLIMIT_NOFILE \
                             allows; raise the limit or make it close files",
                            std::process::id()
                        )
                    };
                    (shared.log)(&format!("refused control connection: {msg}"));
                    refuse(stream, Errno(libc::EMFILE), &msg);
                }
                // Another thread may take the freed number first; then the next shortage
                // falls back to waiting below.
                reserve = open_reserve();
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF | libc::ENOTSOCK)) => {
                // The program closed our socket (a daemon closing every fd): stop serving
                // rather than poll a number the program may reuse for a file of its own.
                (shared.log)("control socket closed by the program; no longer serving");
                return;
            }
            Err(e) => {
                (shared.log)(&format!("control socket accept failed: {e}"));
                // Out of fds or memory: back off instead of spinning.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

thread_local! {
    /// See [`current_caller`]; 0 when this thread serves no request.
    static CALLER: Cell<u32> = const { Cell::new(0) };
}

/// The task the current thread is serving a control request for: the process at the other
/// end of the connection (`SO_PEERCRED`), or the task it named with `ActFor` (a FUSE mount
/// names the task behind each write). `None` outside a request (an in-process call), where
/// the calling thread is itself the one acting. A `trace_marker` write records this task,
/// as the kernel records the task that wrote.
pub fn current_caller() -> Option<u32> {
    CALLER.try_with(|c| c.get()).ok().filter(|&pid| pid != 0)
}

/// Sets [`current_caller`] for one request; the previous value comes back on drop.
struct CallerScope(u32);

impl CallerScope {
    fn enter(pid: u32) -> CallerScope {
        CallerScope(CALLER.with(|c| c.replace(pid)))
    }
}

impl Drop for CallerScope {
    fn drop(&mut self) {
        CALLER.with(|c| c.set(self.0));
    }
}

/// The uid and pid of the process at the other end.
fn peer_credentials(stream: &UnixStream) -> io::Result<(u32, i32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writes of the sizes passed; the fd is a live socket.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.uid, cred.pid))
}

fn refuse(mut stream: UnixStream, errno: Errno, message: &str) {
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    let _ = stream.write_all(&Reply::error(errno, message).encode());
}

fn admit(shared: &Arc<Shared>, stream: UnixStream) {
    let _ = stream.set_nonblocking(false);
    let (uid, pid) = match peer_credentials(&stream) {
        Ok(c) => c,
        Err(e) => {
            (shared.log)(&format!(
                "refused control connection: cannot read its credentials: {e}"
            ));
            return;
        }
    };
    if uid != shared.owner_uid && uid != 0 {
        let msg = format!(
            "refused control connection from pid {pid} uid {uid}: only uid {} and root may connect",
            shared.owner_uid
        );
        (shared.log)(&msg);
        refuse(stream, Errno::EACCES, &msg);
        return;
    }
    if shared.active.fetch_add(1, Ordering::SeqCst) >= shared.max_connections {
        shared.active.fetch_sub(1, Ordering::SeqCst);
        let msg = format!(
            "too many control connections (limit {})",
            shared.max_connections
        );
        (shared.log)(&format!("refused control connection from pid {pid}: {msg}"));
        refuse(stream, Errno(libc::EMFILE), &msg);
        return;
    }
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    if let Ok(clone) = stream.try_clone().map(above_floor) {
        lock(&shared.conns).insert(id, clone);
    }
    let worker = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("ustrace-ctl-conn".into())
        .spawn(move || {
            // Releases the slot even if the file system panics under this connection.
            struct Slot<'a>(&'a Shared, u64);
            impl Drop for Slot<'_> {
                fn drop(&mut self) {
                    lock(&self.0.conns).remove(&self.1);
                    self.0.active.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let _slot = Slot(&worker, id);
            Connection::new(&worker, stream, pid).run();
        });
    if let Err(e) = spawned {
        lock(&shared.conns).remove(&id);
        shared.active.fetch_sub(1, Ordering::SeqCst);
        (shared.log)(&format!("cannot start a control connection thread: {e}"));
    }
}

/// Serves one already-connected stream on the calling thread until the peer hangs up: the
/// per-connection loop of [`serve`] without the socket file or the credential check (the
/// caller vouches for the peer). For tests, fuzzing and socket activation.
pub fn serve_connection(fs: Arc<dyn FileSystem>, stream: UnixStream) {
    let shared = Shared {
        fs,
        log: ServerConfig::default().log,
        stopping: AtomicBool::new(false),
        owner_uid: discover::euid(),
        max_connections: 1,
        frame_timeout: FRAME_TIMEOUT,
        active: AtomicUsize::new(1),
        next_conn: AtomicU64::new(0),
        conns: Mutex::new(HashMap::new()),
    };
    let peer = peer_credentials(&stream).map_or(0, |(_, pid)| pid);
    Connection::new(&shared, stream, peer).run();
}

/// `"/a//./b/"` -> `"a/b"`; `..` is an error, so no request can name a path outside the tree
/// however the file system below resolves it.
pub fn clean_path(path: &str) -> Result<String, Errno> {
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(Errno::EINVAL),
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

/// Whether the peer of `stream` has hung up (or the socket failed).
fn peer_gone(stream: &UnixStream) -> bool {
    let mut fd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: fd is one valid pollfd; timeout 0 makes this a non-blocking check.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n > 0 && fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Reads from a stream until a fixed deadline, however the bytes are spread over time.
struct DeadlineReader<'a> {
    stream: &'a UnixStream,
    deadline: Instant,
}

impl io::Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        match io::Read::read(&mut &*self.stream, buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(io::ErrorKind::TimedOut.into()),
            r => r,
        }
    }
}

struct Connection<'a> {
    shared: &'a Shared,
    stream: UnixStream,
    handles: HashMap<u64, Box<dyn OpenFile>>,
    next_handle: u64,
    scratch: Vec<u8>,
    /// The peer's pid (SO_PEERCRED, at connect), and the task it said it acts for.
    peer: i32,
    act_for: Option<u32>,
}

/// What to do after a request.
enum Next {
    Reply(Reply),
    Hangup,
}

fn fail(errno: Errno, message: String) -> Next {
    Next::Reply(Reply::Error {
        errno: errno.0,
        message,
    })
}

impl<'a> Connection<'a> {
    fn new(shared: &'a Shared, stream: UnixStream, peer: i32) -> Connection<'a> {
        Connection {
            shared,
            stream,
            handles: HashMap::new(),
            next_handle: 1,
            scratch: Vec::new(),
            peer,
            act_for: None,
        }
    }

    /// Reads the next request frame. Waiting for its first byte has no limit (a client may
    /// sit idle between requests); the rest must arrive within the frame timeout, so a
    /// client that sends half a frame and stops cannot hold its slot forever.
    fn next_frame(&mut self) -> Result<Vec<u8>, FrameError> {
        loop {
            let mut fd = libc::pollfd {
                fd: self.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut fd, 1, -1) };
            if n > 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if n < 0 && e.kind() != io::ErrorKind::Interrupted {
                return Err(FrameError::Io(e));
            }
        }
        let mut reader = DeadlineReader {
            stream: &self.stream,
            deadline: Instant::now() + self.shared.frame_timeout,
        };
        proto::read_frame(&mut reader)
    }

    fn run(mut self) {
        let _ = self
            .stream
            .set_write_timeout(Some(self.shared.frame_timeout));
        loop {
            if self.shared.stopping.load(Ordering::SeqCst) {
                return;
            }
            let body = match self.next_frame() {
                Ok(body) => body,
                Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {
                    let msg = format!(
                        "request frame not completed within {:?}; closing the connection",
                        self.shared.frame_timeout
                    );
                    (self.shared.log)(&format!("control connection: {msg}"));
                    let _ = self
                        .stream
                        .write_all(&Reply::error(Errno(libc::ETIMEDOUT), msg).encode());
                    return;
                }
                Err(FrameError::TooLarge { len }) => {
                    let e = FrameError::TooLarge { len };
                    let _ = self
                        .stream
                        .write_all(&Reply::error(Errno::E2BIG, e.to_string()).encode());
                    return;
                }
                Err(FrameError::Closed | FrameError::Io(_)) => return,
            };
            let next = match Request::decode(&body) {
                Ok(req) => {
                    let caller = self
                        .act_for
                        .unwrap_or(u32::try_from(self.peer).unwrap_or(0));
                    let _caller = CallerScope::enter(caller);
                    self.handle(req)
                }
                Err(e) => Next::Reply(Reply::error(e.errno(), e.to_string())),
            };
            match next {
                Next::Reply(reply) => {
                    if self.stream.write_all(&reply.encode()).is_err() {
                        return;
                    }
                }
                Next::Hangup => return,
            }
        }
    }

    fn path(raw: &str) -> Result<String, Next> {
        clean_path(raw).map_err(|e| fail(e, format!("path {raw:?} may not contain ..")))
    }

    fn handle(&mut self, req: Request) -> Next {
        let fs = &self.shared.fs;
        let errno_reply = |path: &str, e: Errno| fail(e, format!("{path}: {e}"));
        match req {
            Request::Hello => Next::Reply(Reply::Hello {
                version: proto::VERSION,
                pid: std::process::id(),
                comm: std::fs::read_to_string("/proc/self/comm")
                    .map(|s| s.trim_end().to_owned())
                    .unwrap_or_default(),
            }),
            Request::Stat { path } => match Self::path(&path) {
                Err(n) => n,
                Ok(p) => match fs.stat(&p) {
                    Ok(st) => Next::Reply(Reply::Stat(st)),
                    Err(e) => errno_reply(&path, e),
                },
            },
            Request::ReadDir { path } => match Self::path(&path) {
                Err(n) => n,
                Ok(p) => match fs.readdir(&p) {
                    Ok(entries) => {
                        let size: usize = entries.iter().map(|e| e.name.len() + 3).sum();
                        if entries.len() > proto::MAX_ENTRIES || size + 64 > proto::MAX_FRAME {
                            fail(
                                Errno::E2BIG,
                                format!("{path}: listing too large for one reply"),
                            )
                        } else {
                            Next::Reply(Reply::Entries(entries))
                        }
                    }
                    Err(e) => errno_reply(&path, e),
                },
            },
            Request::Open { path, flags } => match Self::path(&path) {
                Err(n) => n,
                Ok(p) => self.open(&path, &p, flags),
            },
            Request::Read {
                handle,
                max,
                wait_ms,
            } => self.read(handle, max, wait_ms),
            Request::Write { handle, data } => match self.handles.get_mut(&handle) {
                None => fail(Errno::EBADF, format!("no open file with handle {handle}")),
                Some(file) => match file.write(&data) {
                    Ok(n) => Next::Reply(Reply::Written(n as u32)),
                    Err(e) => fail(e, e.to_string()),
                },
            },
            Request::Close { handle } => match self.handles.remove(&handle) {
                None => fail(Errno::EBADF, format!("no open file with handle {handle}")),
                Some(_) => Next::Reply(Reply::Ok),
            },
            Request::WriteFile { path, data, append } => match Self::path(&path) {
                Err(n) => n,
                Ok(p) => {
                    let flags = if append {
                        OpenFlags::APPEND
                    } else {
                        OpenFlags::TRUNCATE
                    };
                    match fs.open(&p, flags).and_then(|mut f| f.write(&data)) {
                        Ok(n) => Next::Reply(Reply::Written(n as u32)),
                        Err(e) => errno_reply(&path, e),
                    }
                }
            },
            Request::Mkdir { path } => match Self::path(&path) {
                Err(n) => n,
                Ok(p) => match fs.mkdir(&p) {
                    Ok(()) => Next::Reply(Reply::Ok),
                    Err(e) => errno_reply(&path, e),
                },
            },
            Request::Rmdir { path } => match Self::path(&path) {
                Err(n) => n,
                Ok(p) => match fs.rmdir(&p) {
                    Ok(()) => Next::Reply(Reply::Ok),
                    Err(e) => errno_reply(&path, e),
                },
            },
            Request::ActFor { pid: 0 } => {
                self.act_for = None;
                Next::Reply(Reply::Ok)
            }
            // A thread id is no entry of /proc's listing, but /proc/TID resolves.
            Request::ActFor { pid } if Path::new(&format!("/proc/{pid}")).exists() => {
                self.act_for = Some(pid);
                Next::Reply(Reply::Ok)
            }
            Request::ActFor { pid } => fail(
                Errno(libc::ESRCH),
                format!("no task with pid {pid} to act for"),
            ),
        }
    }

    fn open(&mut self, raw: &str, path: &str, flags: OpenFlags) -> Next {
        if self.handles.len() >= MAX_HANDLES {
            return fail(
                Errno(libc::EMFILE),
                format!("more than {MAX_HANDLES} open files"),
            );
        }
        match self.shared.fs.open(path, flags) {
            Ok(file) => {
                let handle = self.next_handle;
                self.next_handle += 1;
                let stream = file.is_stream();
                self.handles.insert(handle, file);
                Next::Reply(Reply::Opened { handle, stream })
            }
            Err(e) => fail(e, format!("{raw}: {e}")),
        }
    }

    fn read(&mut self, handle: u64, max: u32, wait_ms: u32) -> Next {
        let Some(file) = self.handles.get_mut(&handle) else {
            return fail(Errno::EBADF, format!("no open file with handle {handle}"));
        };
        // Zeroing a fresh 1 MiB buffer per read costs more than the round trip itself: keep
        // one per connection and copy out only what was read.
        let want = (max as usize).min(proto::MAX_DATA);
        if self.scratch.len() < want {
            self.scratch.resize(want, 0);
        }
        let buf = &mut self.scratch[..want];
        if !file.is_stream() {
            return match file.read(buf, None) {
                Ok(n) => Next::Reply(Reply::Data(buf[..n].to_vec())),
                Err(e) => fail(e, e.to_string()),
            };
        }
        let deadline = (wait_ms != proto::WAIT_FOREVER)
            .then(|| Instant::now() + Duration::from_millis(u64::from(wait_ms)));
        loop {
            let slice = match deadline {
                None => STREAM_SLICE,
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .min(STREAM_SLICE),
            };
            match file.read(buf, Some(slice)) {
                Ok(n) => return Next::Reply(Reply::Data(buf[..n].to_vec())),
                Err(e) if e == Errno::EAGAIN => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return fail(Errno::EAGAIN, "no data yet".into());
                    }
                    if self.shared.stopping.load(Ordering::SeqCst) || peer_gone(&self.stream) {
                        return Next::Hangup;
                    }
                }
                Err(e) => return fail(e, e.to_string()),
            }
        }
    }
}

fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

/// Starts serving if `USTRACE_SERVE` is set to `1`/`true`/`yes`/`on`, for programs that cannot
/// add a call. `make_fs` is only called when serving starts. The server then lives as long as
/// the process; its socket is removed at normal exit. Returns whether this process now serves
/// (a second call is a no-op returning `true`).
pub fn serve_from_env(make_fs: impl FnOnce() -> Arc<dyn FileSystem>) -> io::Result<bool> {
    match std::env::var(SERVE_ENV) {
        Ok(v) if truthy(&v) => {}
        _ => return Ok(false),
    }
    static GLOBAL: Mutex<Option<ServerHandle>> = Mutex::new(None);
    let mut global = lock(&GLOBAL);
    if global.is_none() {
        let handle = serve(make_fs())?;
        (ServerConfig::default().log)(&format!(
            "serving tracefs at {} (mount it with: ustrace mount -p {} DIR)",
            handle.socket_path().display(),
            std::process::id()
        ));
        *global = Some(handle);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_cleaned_and_dotdot_refused() {
        assert_eq!(clean_path("/events//sched/./x/").unwrap(), "events/sched/x");
        assert_eq!(clean_path("").unwrap(), "");
        assert_eq!(clean_path("/").unwrap(), "");
        assert_eq!(clean_path("events/../../etc"), Err(Errno::EINVAL));
        assert_eq!(clean_path(".."), Err(Errno::EINVAL));
        assert!(clean_path("a..b").is_ok());
    }

    #[test]
    fn truthy_values() {
        for v in ["1", "true", "YES", " on "] {
            assert!(truthy(v), "{v}");
        }
        for v in ["0", "", "no", "2"] {
            assert!(!truthy(v), "{v}");
        }
    }
}
