//! Where control sockets live, and finding the processes that serve one.
//!
//! A serving process binds `<dir>/<pid>.sock`, where `<dir>` is, in order of preference:
//! `$USTRACE_SOCKET_DIR`, `$XDG_RUNTIME_DIR/ustrace`, or `/tmp/ustrace-<uid>`. A client looking
//! for pid P tries the directories P's own environment names (root can read it), its own,
//! and the defaults for P's uid. `ustrace ps` lists every socket it can see, asks each one
//! who it is, and removes the sockets whose process is gone (a killed process cannot remove
//! its own).

use crate::client::Client;
use std::collections::HashSet;
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    for dir in &dirs {
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

/// One process that answered on its control socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub pid: u32,
    /// The process's command name, as it reported it.
    pub comm: String,
    pub socket: PathBuf,
    /// The protocol version it speaks.
    pub version: u8,
}

fn scan_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![default_socket_dir()];
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

/// Lists the processes serving a tracefs in `dirs`, removing the sockets of dead ones.
pub fn list_in(dirs: &[PathBuf]) -> Vec<Served> {
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
            if !pid_alive(pid) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            match Client::connect_path(&path) {
                Ok(mut client) => {
                    client.set_timeout(Some(Duration::from_secs(2)));
                    if let Ok(info) = client.hello() {
                        out.push(Served {
                            pid,
                            comm: info.comm,
                            socket: path,
                            version: info.version,
                        });
                    }
                }
                // The pid lives on in another process that does not listen here.
                Err(e) if e.errno().0 == libc::ECONNREFUSED => {
                    let _ = std::fs::remove_file(&path);
                }
                Err(_) => {}
            }
        }
    }
    out.sort_by_key(|s| s.pid);
    out
}

/// Lists every process serving a tracefs that this user can see.
pub fn list() -> Vec<Served> {
    list_in(&scan_dirs())
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
