//! `ustrace mount`: a running process's tracefs on a directory, until Ctrl-C.
//!
//! The FUSE session runs on background threads (`ustrace_ctl::fuse::Mount`); this thread
//! blocks SIGINT, SIGTERM and SIGHUP before any of them start — so no FUSE thread is ever
//! interrupted mid-request — and waits for one of them with `sigtimedwait`. Every tick it
//! also checks whether the traced process went away or someone ran `umount DIR`. Leaving
//! unmounts (lazily, so a busy mount still goes).

use std::path::{Path, PathBuf};
use ustrace_ctl::discover;
use ustrace_ctl::fuse::{Mount, MountOptions};

#[derive(clap::Args)]
pub struct MountArgs {
    #[command(flatten)]
    pub target: crate::remote::PidArg,
    /// An empty directory to mount on; made (and removed afterwards) if it does not exist.
    /// A directory that is already a mount point, is not empty, or is not a directory is
    /// refused.
    pub dir: PathBuf,
    /// Let the members of GROUP (a name or a gid) use the mount too: files are shown as
    /// owned by GROUP with the kernel's group bits (read, and write `trace_marker`), others
    /// get nothing, and the kernel enforces the modes. Without it only you may use the mount.
    /// (`--allow-other` is the same option: it needs a GROUP, since anyone who can read
    /// `trace_pipe` consumes your events.)
    #[arg(long, alias = "allow-other", value_name = "GROUP")]
    pub allow_group: Option<String>,
}

/// The gid of `group`, a group name or a number.
fn group_id(group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(group).map_err(|_| format!("bad group name {group:?}"))?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: group is plain data; all zeroes is a valid value.
    let mut entry: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and buf's length is passed with it.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut entry,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 {
        return Err(format!(
            "cannot look up group {group:?}: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    if found.is_null() {
        return Err(format!("no group named {group:?}"));
    }
    Ok(entry.gr_gid)
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a sigset_t we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Whether `/proc/self/mountinfo` lists `dir` (absolute, resolved) as a mount point, and if
/// so with which file-system type and source.
fn mounted_at(dir: &Path) -> Option<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // Later lines are mounted on top of earlier ones: the last match is what `dir` shows.
    info.lines().rev().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let target = left.split(' ').nth(4)?;
        if Path::new(&ustrace_ctl::fuse::unescape_mount_path(target)) != dir {
            return None;
        }
        let mut right = right.split(' ');
        Some((right.next()?.to_owned(), right.next()?.to_owned()))
    })
}

/// Checks the mount point as `mount --help` promises, making it when it is missing. Returns
/// whether it was made here (so it is removed again afterwards). A dead mount left by a
/// killed `ustrace mount` (every access fails with ENOTCONN) is let through: mounting
/// detaches it first.
fn prepare_mount_point(dir: &Path) -> Result<bool, String> {
    let shown = dir.display();
    let meta = match std::fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {shown}: {e}"))?;
            eprintln!("ustrace: created {shown} to mount on (it is removed at unmount)");
            return Ok(true);
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return Ok(false),
        Err(e) => return Err(format!("cannot mount on {shown}: {e}")),
    };
    if !meta.is_dir() {
        return Err(format!("cannot mount on {shown}: it is not a directory"));
    }
    let absolute = dir
        .canonicalize()
        .map_err(|e| format!("cannot mount on {shown}: {e}"))?;
    if let Some((fstype, source)) = mounted_at(&absolute) {
        let what = if fstype.starts_with("fuse") && source == "tracefs" {
            "already a ustrace mount; stop its `ustrace mount` (or `umount` it) first".to_owned()
        } else {
            format!("already a mount point ({fstype} from {source})")
        };
        return Err(format!("cannot mount on {shown}: it is {what}"));
    }
    let mut entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot mount on {shown}: {e}"))?;
    if entries.next().is_some() {
        return Err(format!(
            "cannot mount on {shown}: it is not empty (what is in it would be hidden)"
        ));
    }
    Ok(false)
}

pub fn run(args: MountArgs) -> Result<(), String> {
    let allow_group = args.allow_group.as_deref().map(group_id).transpose()?;
    let socket = discover::find_socket(args.target.pid).map_err(|e| e.to_string())?;
    let made = prepare_mount_point(&args.dir)?;
    let result = serve_mount(&args, &socket, allow_group);
    if made {
        // Only if still empty: nothing of anyone else's is ever removed.
        let _ = std::fs::remove_dir(&args.dir);
    }
    result
}

fn serve_mount(args: &MountArgs, socket: &Path, allow_group: Option<u32>) -> Result<(), String> {
    let set = signal_set();
    // SAFETY: blocks signals in this thread only; threads spawned after inherit the mask.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(format!(
            "cannot block signals: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    let options = MountOptions {
        allow_group,
        ..MountOptions::default()
    };
    let mount = Mount::spawn(socket, &args.dir, &options).map_err(|e| e.to_string())?;
    eprintln!(
        "ustrace: pid {}'s tracefs is mounted on {} (Ctrl-C or `umount {}` to unmount)",
        args.target.pid,
        mount.dir().display(),
        mount.dir().display()
    );
    let tick = libc::timespec {
        tv_sec: 0,
        tv_nsec: 200_000_000,
    };
    loop {
        // SAFETY: waits for one of the blocked signals in `set`; no siginfo is requested.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &tick) };
        if sig > 0 {
            break;
        }
        if mount.server_gone() {
            eprintln!("ustrace: process {} went away; unmounting", args.target.pid);
            break;
        }
        if mount.session_ended() {
            eprintln!("ustrace: {} was unmounted", mount.dir().display());
            break;
        }
    }
    mount.unmount();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_named_or_numbered() {
        assert_eq!(group_id("0"), Ok(0));
        assert_eq!(group_id("4242"), Ok(4242));
        assert_eq!(group_id("root"), Ok(0));
        let err = group_id("no-such-group-here").unwrap_err();
        assert!(err.contains("no group named"), "{err}");
    }
}
