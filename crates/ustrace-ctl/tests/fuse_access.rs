//! Who may do what through a FUSE mount: the modes it shows, a group let in with
//! `allow_group` (and nobody else), and the errno of every operation tracefs does not have,
//! compared with the kernel's tracefs on this machine.

mod common;

use common::{serve_sample, TempDir};
use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use ustrace_ctl::fuse::{Mount, MountOptions};

fn fuse_usable() -> bool {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: /dev/fuse is missing");
        return false;
    }
    if !common::is_root() {
        eprintln!("skipped: mounting without fusermount needs root");
        return false;
    }
    true
}

fn mount_dir(tmp: &TempDir) -> PathBuf {
    let dir = tmp.path().join("mnt");
    std::fs::create_dir_all(&dir).unwrap();
    dir.canonicalize().unwrap()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode() & 0o7777
}

/// Adds files with the kernel's modes to the sample tree.
fn kernel_like(s: &common::Served) {
    s.fs.add_file("k_rw", 0o640, b"1\n", None);
    s.fs.add_file("k_ro", 0o440, b"ro\n", None);
    s.fs.add_file("k_marker", 0o220, b"", None);
    s.fs.add_stream("k_pipe", 0o440);
    s.fs.add_dir("k_dir", 0o750, false);
    s.fs.add_file("k_dir/f", 0o640, b"in\n", None);
}

/// Runs `sh -c script` as uid 65534 with primary group `gid` and no other groups.
fn sh_as(gid: u32, script: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(65534)
        .gid(gid)
        .current_dir("/")
        .output()
        .unwrap()
}

#[test]
fn the_mount_shows_the_tracefs_modes() {
    if !fuse_usable() {
        return;
    }
    let s = serve_sample();
    kernel_like(&s);
    let tmp = TempDir::new("modes");
    let dir = mount_dir(&tmp);
    let _m = Mount::spawn(s.handle.socket_path(), &dir, &MountOptions::default()).unwrap();
    assert_eq!(mode(&dir.join("k_rw")), 0o640);
    assert_eq!(mode(&dir.join("k_ro")), 0o440);
    assert_eq!(mode(&dir.join("k_marker")), 0o220);
    assert_eq!(mode(&dir.join("k_pipe")), 0o440);
    assert_eq!(mode(&dir.join("k_dir")), 0o750);
    // SAFETY: getgid has no preconditions.
    let gid = unsafe { libc::getgid() };
    assert_eq!(std::fs::metadata(dir.join("k_rw")).unwrap().gid(), gid);
    // Without a group nobody else gets in, whatever the modes say.
    let out = sh_as(65534, &format!("ls {}", dir.display()));
    assert!(!out.status.success(), "another user listed a private mount");
}

#[test]
fn a_named_group_gets_group_access_and_nobody_else_any() {
    if !fuse_usable() {
        return;
    }
    let s = serve_sample();
    kernel_like(&s);
    let tmp = TempDir::new("group");
    let dir = mount_dir(&tmp);
    let group = 65534;
    let options = MountOptions {
        allow_group: Some(group),
        ..MountOptions::default()
    };
    let _m = Mount::spawn(s.handle.socket_path(), &dir, &options).unwrap();
    let d = dir.display();

    let root = std::fs::metadata(&dir).unwrap();
    assert_eq!((root.mode() & 0o7777, root.gid()), (0o750, group));
    let rw = std::fs::metadata(dir.join("k_rw")).unwrap();
    assert_eq!((rw.mode() & 0o7777, rw.gid()), (0o640, group));
    // A file the tree gives others access to is still closed to them.
    assert_eq!(mode(&dir.join("trace")), 0o640);
    assert_eq!(mode(&dir.join("k_dir")), 0o750);

    // A member reads what the group bits allow, and writes only what they allow.
    let out = sh_as(group, &format!("cat {d}/k_rw {d}/k_dir/f; ls {d}"));
    assert!(
        out.status.success(),
        "a member was refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("1\nin\n"));
    s.fs.push("k_pipe", b"event\n").unwrap();
    let out = sh_as(group, &format!("head -c 6 {d}/k_pipe"));
    assert_eq!(out.stdout, b"event\n");
    let out = sh_as(group, &format!("echo 0 > {d}/k_rw"));
    assert!(!out.status.success(), "a member wrote a 0640 file");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s.fs.content("k_rw").unwrap(), b"1\n");
    let out = sh_as(group, &format!("echo mark > {d}/k_marker"));
    assert!(out.status.success(), "a member could not write a 0220 file");

    // Anyone else gets nothing: not the listing, not a file, not the pipe.
    s.fs.push("k_pipe", b"secret\n").unwrap();
    // The sample's trace_pipe is 0444 in the tree: with a group, others still get nothing.
    s.fs.push("trace_pipe", b"mine\n").unwrap();
    for script in [
        format!("head -c 5 {d}/trace_pipe"),
        format!("ls {d}"),
        format!("cat {d}/k_rw"),
        format!("cat {d}/k_pipe"),
        format!("echo x > {d}/k_marker"),
    ] {
        let out = sh_as(1, &script);
        assert!(!out.status.success(), "a non-member could run `{script}`");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
            "`{script}`: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The event is still there for the owner: nobody else consumed it.
    let mut f = std::fs::File::open(dir.join("k_pipe")).unwrap();
    let mut buf = [0u8; 7];
    std::io::Read::read_exact(&mut f, &mut buf).unwrap();
    assert_eq!(&buf, b"secret\n");
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn errno_of(rc: libc::c_int) -> i32 {
    if rc >= 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

/// Runs each operation tracefs does not have in `base` (which holds a file `file` and a
/// directory `dir`) and returns its errno (0: success) and, for chmod/chown, what it did.
fn unsupported_ops(base: &Path, file: &str, dir: &str) -> Vec<(String, String)> {
    let f = base.join(file);
    let d = base.join(dir);
    let fresh = base.join("no_such_name");
    let mut out = Vec::new();
    let mut record =
        |what: &str, rc: libc::c_int| out.push((what.to_owned(), errno_of(rc).to_string()));
    // SAFETY: plain syscalls on NUL-terminated paths that live across each call; the fd
    // returned is closed at once.
    unsafe {
        record(
            "rename file",
            libc::rename(c(&f).as_ptr(), c(&fresh).as_ptr()),
        );
        record(
            "rename into dir",
            libc::rename(c(&f).as_ptr(), c(&d.join("moved")).as_ptr()),
        );
        record(
            "rename dir",
            libc::rename(c(&d).as_ptr(), c(&fresh).as_ptr()),
        );
        record("link", libc::link(c(&f).as_ptr(), c(&fresh).as_ptr()));
        record("symlink", libc::symlink(c(&f).as_ptr(), c(&fresh).as_ptr()));
        record("unlink", libc::unlink(c(&f).as_ptr()));
        record(
            "mknod fifo",
            libc::mknod(c(&fresh).as_ptr(), libc::S_IFIFO | 0o600, 0),
        );
        let fd = libc::open(c(&fresh).as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600);
        record("open O_CREAT", fd);
        if fd >= 0 {
            libc::close(fd);
        }
        let name = CString::new("user.x").unwrap();
        let mut buf = [0u8; 64];
        record(
            "getxattr",
            libc::getxattr(c(&f).as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 64) as i32,
        );
        record(
            "listxattr",
            libc::listxattr(c(&f).as_ptr(), buf.as_mut_ptr().cast(), 64) as i32,
        );
        record(
            "setxattr",
            libc::setxattr(c(&f).as_ptr(), name.as_ptr(), b"1".as_ptr().cast(), 1, 0),
        );
        record(
            "removexattr",
            libc::removexattr(c(&f).as_ptr(), name.as_ptr()),
        );
        record("utimes", libc::utimes(c(&f).as_ptr(), std::ptr::null()));
        record("truncate", libc::truncate(c(&f).as_ptr(), 0));
        record("chmod", libc::chmod(c(&f).as_ptr(), 0o600));
        record("chown", libc::chown(c(&f).as_ptr(), 2, 2));
    }
    let meta = std::fs::metadata(&f).unwrap();
    out.push((
        "after chmod, chown".into(),
        format!("{:04o} {}:{}", meta.mode() & 0o7777, meta.uid(), meta.gid()),
    ));
    out
}

#[test]
fn operations_tracefs_lacks_fail_as_on_the_kernel() {
    if !fuse_usable() {
        return;
    }
    let s = serve_sample();
    s.fs.add_file("f", 0o640, b"", None);
    s.fs.add_dir("d", 0o750, false);
    let tmp = TempDir::new("ops");
    let dir = mount_dir(&tmp);
    let _m = Mount::spawn(s.handle.socket_path(), &dir, &MountOptions::default()).unwrap();
    let ours = unsupported_ops(&dir, "f", "d");

    let kernel_instance = PathBuf::from(format!(
        "/sys/kernel/tracing/instances/ustrace-ctl-ops-{}",
        std::process::id()
    ));
    let theirs = if std::fs::create_dir(&kernel_instance).is_ok() {
        // `trace` and `per_cpu`: a file and a directory of the instance, gone with it.
        let r = unsupported_ops(&kernel_instance, "trace", "per_cpu");
        std::fs::remove_dir(&kernel_instance).unwrap();
        r
    } else {
        eprintln!("skipped (part): no kernel tracefs instance to compare with; using 6.18's");
        let e = |n: i32| n.to_string();
        vec![
            ("rename file".into(), e(libc::EPERM)),
            ("rename into dir".into(), e(libc::EPERM)),
            ("rename dir".into(), e(libc::EPERM)),
            ("link".into(), e(libc::EPERM)),
            ("symlink".into(), e(libc::EPERM)),
            ("unlink".into(), e(libc::EPERM)),
            ("mknod fifo".into(), e(libc::EPERM)),
            ("open O_CREAT".into(), e(libc::EACCES)),
            ("getxattr".into(), e(libc::EOPNOTSUPP)),
            ("listxattr".into(), e(0)),
            ("setxattr".into(), e(libc::EOPNOTSUPP)),
            ("removexattr".into(), e(libc::EOPNOTSUPP)),
            ("utimes".into(), e(0)),
            ("truncate".into(), e(0)),
            ("chmod".into(), e(0)),
            ("chown".into(), e(0)),
            ("after chmod, chown".into(), "0600 2:2".into()),
        ]
    };
    assert_eq!(
        ours, theirs,
        "left: through the mount, right: the kernel's tracefs"
    );
    // Nothing was made or moved in the tree.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert!(names.contains(&"f".to_owned()) && !names.contains(&"no_such_name".to_owned()));
}
