//! `ustrace exec -P PID -- CMD [ARGS]`: run CMD where a process's tracefs is *the* tracefs.
//!
//! Tools built on libtracefs (trace-cmd, rtla, ...) find tracefs by themselves: libtracefs
//! takes the mount point of the first line of `/proc/mounts` whose type is exactly
//! `tracefs` (no environment variable overrides it; `tracefs_set_tracing_dir` is an API
//! call only). A FUSE mount's type is `fuse` or `fuse.SUBTYPE`, never `tracefs`, so a
//! ustrace mount alone is never found. This verb gives CMD a private mount namespace in which
//! every mount of type `tracefs` has the process's FUSE mount bound on top of it:
//!
//! ```text
//!   /proc/mounts in CMD's namespace            what a path there opens
//!   nodev /sys/kernel/tracing tracefs ...      ─┐
//!   tracefs /sys/kernel/tracing fuse ...       ─┴─► the FUSE mount on top: PID's tracefs
//! ```
//!
//! The kernel's own line stays (first, so libtracefs picks that mount point) and so does
//! ours (after it, as every mount on top is listed): nothing in `/proc/mounts` is made up,
//! and every path the tools build under the mount point resolves to the top mount. Where no
//! tracefs is mounted at `/sys/kernel/tracing`, root mounts the kernel's there first.
//!
//! Root unshares the mount namespace; another user unshares a user namespace too (mapping
//! only their own uid and gid), where FUSE may be mounted with mount(2) if `/dev/fuse` is
//! theirs to open. The FUSE session is served by threads of this process, which stays to
//! the end of CMD: it ignores the Ctrl-C that CMD gets from the terminal (trace-cmd
//! record's "stop"), passes on a signal sent to it with kill(2), and exits with CMD's status.
//! When it exits the namespace, and the mount in it, are gone: nothing is left behind.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use ustrace_ctl::discover;
use ustrace_ctl::fuse::{Mount, MountOptions};

/// Where libtracefs and trace-cmd look first, and where the kernel mounts tracefs.
const TRACEFS: &str = "/sys/kernel/tracing";

#[derive(clap::Args)]
pub struct ExecArgs {
    /// The process whose tracefs CMD sees (see `ustrace ps`); `-P` as trace-cmd spells it.
    #[arg(
        short = 'P',
        visible_short_alias = 'p',
        long = "pid",
        value_name = "PID"
    )]
    pub pid: u32,
    /// The command to run, and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(1)
}

fn write_proc(path: &str, text: &str) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("cannot write {path}: {e}"))
}

/// Enters a mount namespace of our own (and, for a user, a user namespace first), with
/// nothing propagating back out. Must run while this process has one thread: unshare(2)
/// refuses both namespaces to a multithreaded process.
fn enter_namespace(root: bool) -> Result<(), String> {
    if threads() != 1 {
        return Err("ustrace exec must enter its namespace before any thread starts".into());
    }
    if root {
        // SAFETY: unshare has no memory-safety preconditions.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            return Err(os_err("cannot make a mount namespace (unshare)"));
        }
    } else {
        if let Err(e) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
        {
            return Err(format!(
                "as a user, `ustrace exec` mounts FUSE itself inside a user namespace, and \
                 this user cannot open /dev/fuse ({e}); run it as root, or make /dev/fuse \
                 mode 0666 as most distributions do"
            ));
        }
        // SAFETY: getuid/getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        // SAFETY: unshare has no memory-safety preconditions.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
            return Err(format!(
                "{}; without root, `ustrace exec` needs unprivileged user namespaces \
                 (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone)",
                os_err("cannot make a user namespace (unshare)")
            ));
        }
        // Only our own ids: the command runs as who it was, with no power outside.
        write_proc("/proc/self/setgroups", "deny")?;
        write_proc("/proc/self/uid_map", &format!("{uid} {uid} 1"))?;
        write_proc("/proc/self/gid_map", &format!("{gid} {gid} 1"))?;
    }
    // SAFETY: the strings are NUL-terminated literals; a null source/type is allowed for a
    // propagation change.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(os_err("cannot make the mounts private"));
    }
    Ok(())
}

/// The mount points of type `tracefs` in this namespace, in `/proc/mounts` order.
fn tracefs_mount_points() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut points: Vec<PathBuf> = Vec::new();
    for line in mounts.lines() {
        let mut fields = line.split(' ');
        let (Some(_), Some(target), Some(fstype)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let point = PathBuf::from(ustrace_ctl::fuse::unescape_mount_path(target));
        if fstype == "tracefs" && !points.contains(&point) {
            points.push(point);
        }
    }
    points
}

fn cstr(path: &Path) -> Result<std::ffi::CString, String> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: a path with a NUL byte", path.display()))
}

fn bind(from: &Path, to: &Path) -> Result<(), String> {
    let (src, dst) = (cstr(from)?, cstr(to)?);
    // SAFETY: both are valid NUL-terminated paths for the duration of the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(os_err(&format!(
            "cannot bind the mount on {}",
            to.display()
        )));
    }
    Ok(())
}

/// Makes sure a tracefs line names `/sys/kernel/tracing` (root mounts the kernel's there if
/// none does), then binds `ours` on every tracefs mount point.
fn cover_tracefs(ours: &Path, root: bool) -> Result<Vec<PathBuf>, String> {
    let mut points = tracefs_mount_points();
    if !points.iter().any(|p| p == Path::new(TRACEFS)) {
        if !root {
            if points.is_empty() {
                return Err(format!(
                    "no tracefs is mounted, so tools would not look for one, and only root \
                     may mount one (on {TRACEFS}); run `ustrace exec` as root"
                ));
            }
        } else {
            // SAFETY: NUL-terminated literals; tracefs takes no data.
            let rc = unsafe {
                libc::mount(
                    c"nodev".as_ptr(),
                    c"/sys/kernel/tracing".as_ptr(),
                    c"tracefs".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            if rc != 0 {
                return Err(os_err(&format!(
                    "no tracefs is mounted and one cannot be mounted on {TRACEFS}"
                )));
            }
            points.insert(0, PathBuf::from(TRACEFS));
        }
    }
    // A user's tools cannot find a mount point the user cannot reach (the kernel's tracefs
    // under a root-only /sys/kernel/debug, say), so there is nothing to cover there.
    if !root {
        points.retain(|p| reachable(p));
        if points.is_empty() {
            return Err(
                "no tracefs mount point is reachable by this user, so tools would \
                        not find one; run `ustrace exec` as root"
                    .to_string(),
            );
        }
    }
    for point in &points {
        bind(ours, point)?;
    }
    Ok(points)
}

/// Whether the calling user may reach the mount point `dir`: search permission on every
/// directory on the way to it (not on the point itself: the kernel's tracefs root is 0700,
/// and binding over it needs no access to what it holds).
fn reachable(dir: &Path) -> bool {
    let Ok(path) = cstr(dir.parent().unwrap_or(dir)) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path for the duration of the call.
    unsafe { libc::access(path.as_ptr(), libc::X_OK) == 0 }
}

/// The kernel's switches for tracers a process has not (its function tracer and stack
/// tracer): trace-cmd record writes `ftrace_enabled` whenever it exists, and dies if the
/// write fails, which it does for a user and in most containers.
const KERNEL_TRACER_SWITCHES: [&str; 2] = ["ftrace_enabled", "stack_tracer_enabled"];

/// Makes `/proc/sys/kernel` in this namespace show what a kernel without the function and
/// stack tracers shows: everything but [`KERNEL_TRACER_SWITCHES`]. A tmpfs goes on top of
/// the directory and each other entry is bound back from the real one, so reads and writes
/// of every other sysctl reach the kernel as before. The process has no function tracer, so
/// this is what its world looks like (trace-cmd skips a switch that does not exist).
fn hide_kernel_tracer_switches() -> Result<(), String> {
    let kernel = Path::new("/proc/sys/kernel");
    if !KERNEL_TRACER_SWITCHES
        .iter()
        .any(|name| kernel.join(name).exists())
    {
        return Ok(());
    }
    // The real directory stays reachable at a staging point while the tmpfs covers it.
    let stage = tempfile_dir()?;
    let result = (|| {
        bind(kernel, &stage)?;
        let entries = std::fs::read_dir(&stage)
            .map_err(|e| format!("cannot list {}: {e}", kernel.display()))?;
        let target = cstr(kernel)?;
        // SAFETY: NUL-terminated literals and path; tmpfs takes the mode option string.
        let rc = unsafe {
            libc::mount(
                c"ustrace-sysctl".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"mode=0555".as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(os_err("cannot cover /proc/sys/kernel"));
        }
        let bound = (|| {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if KERNEL_TRACER_SWITCHES.iter().any(|s| name == *s) {
                    continue;
                }
                let to = kernel.join(&name);
                let made = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    std::fs::create_dir(&to)
                } else {
                    std::fs::File::create(&to).map(drop)
                };
                made.map_err(|e| format!("cannot make {}: {e}", to.display()))?;
                bind(&entry.path(), &to)?;
            }
            Ok(())
        })();
        if let Err(e) = bound {
            // Half a /proc/sys/kernel is worse than the whole: take the cover off again.
            // SAFETY: target is a valid NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            return Err(e);
        }
        // Read-only from here, as the directory itself is on procfs (cosmetic: a failure
        // leaves it writable by root only, mode 0555).
        // SAFETY: as above.
        unsafe {
            libc::mount(
                std::ptr::null(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV
                    | libc::MS_NOEXEC,
                c"mode=0555".as_ptr().cast(),
            )
        };
        Ok(())
    })();
    let c = cstr(&stage)?;
    // SAFETY: c is a valid NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    let _ = std::fs::remove_dir(&stage);
    result
}

fn blocked_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a sigset_t we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

pub fn run(args: ExecArgs) -> Result<u8, String> {
    let socket = discover::find_socket(args.pid).map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    enter_namespace(root)?;
    if let Err(e) = hide_kernel_tracer_switches() {
        eprintln!(
            "ustrace: {e}; /proc/sys/kernel/ftrace_enabled stays visible, and trace-cmd \
             record stops where it may not write it"
        );
    }
    let set = blocked_signals();
    // SAFETY: blocks signals in this thread; the FUSE threads spawned below inherit the
    // mask, so none of them is ever interrupted mid-request. The child unblocks them.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };

    // Mounted first on a directory of its own: the mount point of mount(2) for FUSE must be
    // openable, and a user may not open the kernel's tracefs root. Binding needs no open.
    let stage = tempfile_dir()?;
    let options = MountOptions {
        own_namespace: !root,
        ..MountOptions::default()
    };
    let mounted = Mount::spawn(&socket, &stage, &options).map_err(|e| e.to_string());
    let result = mounted.and_then(|mount| {
        let covered = cover_tracefs(mount.dir(), root);
        // The staging mount point is not needed past this (the binds share its FUSE
        // connection), and nobody should find a second path to it.
        let c = cstr(mount.dir())?;
        // SAFETY: c is a valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir(&stage);
        covered?;
        let status = run_child(&args.command, &set)?;
        // Dropping `mount` would wait for its session, which the binds keep alive; the
        // namespace and its mounts go away with this process.
        std::mem::forget(mount);
        Ok(status)
    });
    let _ = std::fs::remove_dir(&stage);
    result
}

/// A fresh empty directory to mount on, in the temporary directory.
fn tempfile_dir() -> Result<PathBuf, String> {
    let base = std::env::temp_dir();
    let mut template = base
        .join("ustrace-exec-XXXXXX")
        .into_os_string()
        .into_encoded_bytes();
    template.push(0);
    // SAFETY: template is a writable NUL-terminated buffer ending in XXXXXX, as mkdtemp needs.
    let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if made.is_null() {
        return Err(os_err(&format!(
            "cannot make a directory in {}",
            base.display()
        )));
    }
    template.pop();
    // SAFETY: the bytes came from an OsString, with only the X's replaced by ASCII.
    Ok(PathBuf::from(unsafe {
        OsString::from_encoded_bytes_unchecked(template)
    }))
}

/// Runs CMD and waits for it, passing on the signals sent to this process with kill(2)
/// (`kill`, `timeout`); those the terminal sends (Ctrl-C, Ctrl-\, hang-up) reach CMD by
/// themselves, since it is in the same process group. Returns the exit code a shell would
/// show.
fn run_child(command: &[OsString], set: &libc::sigset_t) -> Result<u8, String> {
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    // SAFETY: runs in the forked child before exec and makes only async-signal-safe calls
    // on stack data.
    unsafe {
        cmd.pre_exec(|| {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            // As a shell answers: 127 for a command not found, 126 for one it cannot run.
            eprintln!(
                "ustrace: cannot run {}: {e}",
                Path::new(&command[0]).display()
            );
            return Ok(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let pid = child.id() as libc::pid_t;
    let tick = libc::timespec {
        tv_sec: 0,
        tv_nsec: 50_000_000,
    };
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(shell_status(&status));
        }
        // SAFETY: siginfo_t is plain data; all zeroes is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits for one of the blocked signals in `set`, filling `info`.
        let sig = unsafe { libc::sigtimedwait(set, &mut info, &tick) };
        let sent = info.si_code == libc::SI_USER || info.si_code == libc::SI_QUEUE;
        if sig > 0 && sent {
            // SAFETY: kill has no memory-safety preconditions; pid is our child's.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

/// The status a shell gives a command that ended so: its exit code, or 128 plus the number
/// of the signal that killed it (`exec` and `record` end with their command's).
pub(crate) fn shell_status(status: &std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        _ => 1,
    }
}
