//! Where control sockets live, and finding the processes that serve one.
//!
//! A serving process binds `<dir>/<pid>.sock`, where `<dir>` is, in order of preference:
//! `$USTRACE_SOCKET_DIR`, `$XDG_RUNTIME_DIR/ustrace`, or `/tmp/ustrace-<uid>`. When the default
//! is unusable (another user made `/tmp/ustrace-<uid>` first), the server makes a private
//! `/tmp/ustrace-<uid>.XXXXXX` instead. A client looking for pid P tries the directories P's
//! own environment names (root can read it), its own, the defaults for P's uid, then those
//! private fallbacks; it trusts a directory only if P's user (or root) owns it and nobody
//! else can replace what is in it ([`unsafe_dir`]), so a socket planted by another user is
//! never taken for P's. [`live_sockets_in`] finds every socket it can see and removes those
//! whose process is gone (a killed process cannot remove its own); asking each live one who it
//! is, for `ustrace ps`, is the client's ([`crate::client::list`]).

use std::collections::HashSet;
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Overrides the socket directory, for the server and for clients alike.
pub const SOCKET_DIR_ENV: &str = "USTRACE_SOCKET_DIR";

/// The effective uid of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn dir_from(socket_dir: Option<OsString>, runtime_dir: Option<OsString>, uid: u32) -> PathBuf {
    if let Some(dir) = socket_dir.filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(rt) = runtime_dir.filter(|d| !d.is_empty()) {
        if Path::new(&rt).is_dir() {
            return Path::new(&rt).join("ustrace");
        }
    }
    PathBuf::from(format!("/tmp/ustrace-{uid}"))
}

/// The socket directory named by `$USTRACE_SOCKET_DIR`, if it is set and not empty.
pub fn configured_socket_dir() -> Option<PathBuf> {
    std::env::var_os(SOCKET_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// Why a directory (described by `meta`, from `symlink_metadata`) is no safe place for the
/// sockets of `uid`, or `None` if it is. Unsafe: a symbolic link (it can be re-pointed), not
/// a directory, owned by a user other than `uid` and root, or writable by group or others
/// without the sticky bit (they could rename or remove our socket and put theirs there).
pub fn unsafe_dir(meta: &std::fs::Metadata, uid: u32) -> Option<String> {
    let mode = meta.mode();
    if meta.file_type().is_symlink() {
        return Some("is a symbolic link".into());
    }
    if !meta.is_dir() {
        return Some("is not a directory".into());
    }
    if meta.uid() != uid && meta.uid() != 0 {
        return Some(format!("belongs to uid {}, not to uid {uid}", meta.uid()));
    }
    if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
        return Some(format!(
            "is writable by other users (mode {:04o}) and not sticky",
            mode & 0o7777
        ));
    }
    None
}

const FALLBACK_PARENT: &str = "/tmp";

fn fallback_prefix(uid: u32) -> String {
    format!("ustrace-{uid}.")
}

/// The `mkdtemp` template of the private directory a server of `uid` falls back to.
pub fn fallback_template(uid: u32) -> PathBuf {
    Path::new(FALLBACK_PARENT).join(format!("{}XXXXXX", fallback_prefix(uid)))
}

/// Whether `dir` is named like a private fallback directory of `uid`.
pub fn is_fallback_dir(dir: &Path, uid: u32) -> bool {
    dir.parent() == Some(Path::new(FALLBACK_PARENT))
        && dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(&fallback_prefix(uid)))
}

/// The private fallback directories of `uid` that are safe to trust (see [`unsafe_dir`]):
/// anyone can make a directory with such a name, but only `uid`'s own count.
pub fn fallback_dirs(uid: u32) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(FALLBACK_PARENT) else {
        return Vec::new();
    };
    let prefix = fallback_prefix(uid);
    let mut dirs: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .filter(|d| {
            std::fs::symlink_metadata(d)
                .is_ok_and(|m| m.uid() == uid && unsafe_dir(&m, uid).is_none())
        })
        .collect();
    dirs.sort();
    dirs
}

/// Whether `dir` may hold sockets of `uid`: an existing directory that passes [`unsafe_dir`]
/// (or one we cannot look at, where connecting will say why).
fn trusted_dir(dir: &Path, uid: u32) -> bool {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) => unsafe_dir(&meta, uid).is_none(),
        Err(e) => e.kind() == io::ErrorKind::PermissionDenied,
    }
}

/// The directory this process binds its socket in.
pub fn default_socket_dir() -> PathBuf {
    dir_from(
        std::env::var_os(SOCKET_DIR_ENV),
        std::env::var_os("XDG_RUNTIME_DIR"),
        euid(),
    )
}

/// The socket file a process with `pid` binds in `dir`.
pub fn socket_name(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.sock"))
}

fn environ_of(pid: u32) -> Vec<(OsString, OsString)> {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return Vec::new();
    };
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let eq = kv.iter().position(|b| *b == b'=')?;
            Some((
                OsString::from_vec(kv[..eq].to_vec()),
                OsString::from_vec(kv[eq + 1..].to_vec()),
            ))
        })
        .collect()
}

fn uid_of(pid: u32) -> Option<u32> {
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}

/// Whether a process with this pid exists (zombies included).
pub fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The directories a socket for `pid` may be in, most likely first.
pub fn candidate_dirs(pid: u32) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let env = environ_of(pid);
    let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let uid = uid_of(pid);
    if let Some(uid) = uid {
        if !env.is_empty() {
            dirs.push(dir_from(get(SOCKET_DIR_ENV), get("XDG_RUNTIME_DIR"), uid));
        }
    }
    dirs.push(default_socket_dir());
    if let Some(uid) = uid {
        dirs.push(PathBuf::from(format!("/run/user/{uid}/ustrace")));
        dirs.push(PathBuf::from(format!("/tmp/ustrace-{uid}")));
        dirs.extend(fallback_dirs(uid));
    }
    let mut seen = HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The socket of process `pid`, or an error saying why there is none.
pub fn find_socket(pid: u32) -> io::Result<PathBuf> {
    if !pid_alive(pid) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no process with pid {pid}"),
        ));
    }
    let dirs = candidate_dirs(pid);
    let uid = uid_of(pid).unwrap_or_else(euid);
    for dir in &dirs {
        // A socket in a directory another user controls could be theirs, not pid's.
        if !trusted_dir(dir, uid) {
            continue;
        }
        let path = socket_name(dir, pid);
        match std::fs::symlink_metadata(&path) {
            Ok(_) => return Ok(path),
            // A directory we may not search: the socket may well be there, and connecting
            // explains the refusal better than "not found" would.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Ok(path),
            Err(_) => {}
        }
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "process {pid} serves no tracefs (no {pid}.sock in {}); start it with USTRACE_SERVE=1",
            looked.join(", ")
        ),
    ))
}

/// The control sockets in `dirs` whose process is alive and whose directory its user
/// trusts, as `(pid, socket)`; sockets of dead processes are removed on the way.
pub fn live_sockets_in(dirs: &[PathBuf]) -> Vec<(u32, PathBuf)> {
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in rd.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let Some(pid) = name
                .strip_suffix(".sock")
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let path = entry.path();
            if uid_of(pid).is_some_and(|uid| !trusted_dir(dir, uid)) {
                continue;
            }
            if !pid_alive(pid) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            out.push((pid, path));
        }
    }
    out
}

/// Every directory a process of this user (every user, for root) may serve from.
pub fn scan_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![default_socket_dir()];
    dirs.extend(fallback_dirs(euid()));
    if std::env::var_os(SOCKET_DIR_ENV).is_none() && euid() == 0 {
        // Root may reach every user's processes; look where their servers bind.
        for (parent, pattern_prefix, suffix) in [
            ("/tmp", "ustrace-", None),
            ("/run/user", "", Some("ustrace")),
        ] {
            let Ok(rd) = std::fs::read_dir(parent) else {
                continue;
            };
            for entry in rd.flatten() {
                let name = entry.file_name();
                if !name.to_string_lossy().starts_with(pattern_prefix) {
                    continue;
                }
                let mut dir = entry.path();
                if let Some(s) = suffix {
                    dir = dir.join(s);
                }
                dirs.push(dir);
            }
        }
    }
    let mut seen = HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_preference_order() {
        let tmp = std::env::temp_dir();
        assert_eq!(
            dir_from(Some("/x/y".into()), Some(tmp.clone().into()), 7),
            PathBuf::from("/x/y")
        );
        assert_eq!(
            dir_from(None, Some(tmp.clone().into()), 7),
            tmp.join("ustrace")
        );
        assert_eq!(
            dir_from(Some("".into()), Some("/does/not/exist".into()), 7),
            PathBuf::from("/tmp/ustrace-7")
        );
    }

    #[test]
    fn missing_process_is_named_in_the_error() {
        // Pids above pid_max (at most 2^22) cannot exist.
        let err = find_socket(u32::MAX - 1).unwrap_err();
        assert!(err.to_string().contains("no process with pid"), "{err}");
        let me = std::process::id();
        assert!(candidate_dirs(me).contains(&default_socket_dir()));
    }
}
