//! The FUSE door, driven the way a person drives it: `sh -c 'echo … > …'`, `cat`, `mkdir`,
//! Ctrl-C on a blocked `cat trace_pipe`, and kill -9 of either end.

mod common;

use common::{serve_sample, sigkill, spawn_sample_server, TempDir};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use ustrace_ctl::fuse::{self, Mount, MountOptions};

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

fn sh(script: &str) -> Output {
    Command::new("sh").arg("-c").arg(script).output().unwrap()
}

fn sh_ok(script: &str) -> String {
    let out = sh(script);
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn mount_line(dir: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let dir = dir.to_str().unwrap();
    mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(dir))
        .map(str::to_owned)
}

fn mount_dir(tmp: &TempDir) -> PathBuf {
    let dir = tmp.path().join("mnt");
    std::fs::create_dir_all(&dir).unwrap();
    dir.canonicalize().unwrap()
}

#[test]
fn the_shell_uses_the_mount_as_it_uses_tracefs() {
    if !fuse_usable() {
        return;
    }
    let s = serve_sample();
    let tmp = TempDir::new("fuse");
    let dir = mount_dir(&tmp);
    let m = Mount::spawn(s.handle.socket_path(), &dir, &MountOptions::default()).unwrap();
    let d = dir.display();

    let line = mount_line(&dir).expect("not in /proc/mounts");
    assert!(line.starts_with("tracefs "), "{line}");

    assert_eq!(
        sh_ok(&format!("ls {d}")),
        "events\ninstances\ntrace\ntrace_pipe\ntracing_on\n"
    );
    assert_eq!(sh_ok(&format!("cat {d}/trace")), "# tracer: nop\n");

    let ev = format!("{d}/events/sched/sched_switch");
    sh_ok(&format!("echo 1 > {ev}/enable"));
    assert_eq!(
        s.fs.content("events/sched/sched_switch/enable").unwrap(),
        b"1\n"
    );
    assert_eq!(sh_ok(&format!("cat {ev}/enable")), "1\n");

    // A bad filter: the write fails with EINVAL, as the kernel's does.
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("echo 'x > 1' > {ev}/filter"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("write error: Invalid argument"), "{err}");
    let out = sh(&format!("echo 'x > 1' > {ev}/filter"));
    assert!(!out.status.success(), "dash did not see the write fail");
    sh_ok(&format!("echo 'prev_pid > 10' > {ev}/filter"));
    assert_eq!(sh_ok(&format!("cat {ev}/filter")), "prev_pid > 10\n");

    // >> appends; > truncates at open, even with nothing written.
    sh_ok(&format!("echo a >> {d}/trace; echo b >> {d}/trace"));
    assert_eq!(sh_ok(&format!("cat {d}/trace")), "# tracer: nop\na\nb\n");
    sh_ok(&format!(": > {d}/trace"));
    assert_eq!(sh_ok(&format!("cat {d}/trace")), "");

    // Read-only files and names that do not exist.
    assert!(!sh(&format!("echo 1 > {ev}/format")).status.success());
    let out = sh(&format!("echo 1 > {d}/no_such_file"));
    assert!(!out.status.success());

    // Instances.
    sh_ok(&format!("mkdir {d}/instances/foo"));
    assert_eq!(
        sh_ok(&format!("ls {d}/instances/foo")),
        "trace\ntracing_on\n"
    );
    sh_ok(&format!("echo 0 > {d}/instances/foo/tracing_on"));
    assert_eq!(sh_ok(&format!("cat {d}/instances/foo/tracing_on")), "0\n");
    assert!(!sh(&format!("mkdir {d}/instances/foo")).status.success());
    sh_ok(&format!("rmdir {d}/instances/foo"));
    assert_eq!(sh_ok(&format!("ls {d}/instances")), "");

    // A large snapshot read in many FUSE reads, at every offset.
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    s.fs.add_file("big", 0o444, &big, None);
    assert_eq!(std::fs::read(dir.join("big")).unwrap(), big);

    // A directory too long for one readdir page.
    s.fs.add_dir("many", 0o755, false);
    for i in 0..600 {
        s.fs.add_file(
            &format!("many/a_rather_long_event_name_{i:04}"),
            0o644,
            b"",
            None,
        );
    }
    let listed = sh_ok(&format!("ls {d}/many"));
    assert_eq!(listed.lines().count(), 600);
    assert!(listed.lines().last().unwrap().ends_with("_0599"));

    drop(m);
    assert!(mount_line(&dir).is_none(), "still mounted after drop");
}

#[test]
fn cat_trace_pipe_blocks_streams_and_ctrl_c_ends_it() {
    if !fuse_usable() {
        return;
    }
    let s = serve_sample();
    let tmp = TempDir::new("pipe");
    let dir = mount_dir(&tmp);
    let m = Mount::spawn(s.handle.socket_path(), &dir, &MountOptions::default()).unwrap();
    let mut cat = Command::new("cat")
        .arg(dir.join("trace_pipe"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = cat.stdout.take().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        cat.try_wait().unwrap().is_none(),
        "cat trace_pipe did not block"
    );
    s.fs.push("trace_pipe", b"first\n").unwrap();
    let mut buf = [0u8; 64];
    let n = out.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"first\n");
    s.fs.push("trace_pipe", b"second\n").unwrap();
    let n = out.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"second\n");

    // Ctrl-C: SIGINT to the blocked cat.
    let start = Instant::now();
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(cat.id() as i32, libc::SIGINT) };
    let status = loop {
        if let Some(st) = cat.try_wait().unwrap() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "cat ignored Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(!status.success());
    eprintln!("cat ended {:?} after SIGINT", start.elapsed());

    // O_NONBLOCK readers get EAGAIN instead of blocking.
    let out = sh(&format!(
        "dd if={}/trace_pipe iflag=nonblock count=1 2>&1",
        dir.display()
    ));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Resource temporarily unavailable"), "{text}");
    drop(m);
}

#[test]
fn a_killed_mount_server_is_cleaned_up_by_the_next_mount() {
    if !fuse_usable() {
        return;
    }
    let s = serve_sample();
    let tmp = TempDir::new("stale");
    let dir = mount_dir(&tmp);
    let mut child = spawn_sample_server(&[
        "mount".as_ref(),
        s.handle.socket_path().as_os_str(),
        dir.as_os_str(),
    ]);
    assert_eq!(sh_ok(&format!("cat {}/tracing_on", dir.display())), "1\n");
    sigkill(&mut child);
    let err = std::fs::metadata(&dir).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");

    let m = Mount::spawn(s.handle.socket_path(), &dir, &MountOptions::default()).unwrap();
    assert_eq!(sh_ok(&format!("cat {}/tracing_on", dir.display())), "1\n");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let count = mounts
        .lines()
        .filter(|l| l.split(' ').nth(1) == dir.to_str())
        .count();
    assert_eq!(count, 1, "stale mount still stacked under the new one");
    drop(m);
    assert!(!fuse::cleanup_stale(&dir).unwrap(), "nothing stale is left");
}

#[test]
fn the_mount_notices_when_the_traced_process_is_killed() {
    if !fuse_usable() {
        return;
    }
    let tmp = TempDir::new("gone");
    let sock_dir = tmp.path().join("sock");
    let mut child = spawn_sample_server(&["serve".as_ref(), sock_dir.as_os_str()]);
    let socket = sock_dir.join(format!("{}.sock", child.id()));
    let dir = mount_dir(&tmp);
    let m = Mount::spawn(&socket, &dir, &MountOptions::default()).unwrap();
    assert_eq!(sh_ok(&format!("cat {}/tracing_on", dir.display())), "1\n");
    assert!(!m.server_gone());
    sigkill(&mut child);
    let deadline = Instant::now() + Duration::from_secs(3);
    while !m.server_gone() {
        assert!(
            Instant::now() < deadline,
            "mount did not notice the process died"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Meanwhile the shell gets an error, not a hang.
    assert!(!sh(&format!("cat {}/tracing_on", dir.display()))
        .status
        .success());
    drop(m);
    assert!(mount_line(&dir).is_none());
    // And mounting a process that is gone fails cleanly.
    assert!(Mount::spawn(&socket, &dir, &MountOptions::default()).is_err());
}

#[test]
fn unmounting_ends_a_blocked_reader_cleanly() {
    if !fuse_usable() {
        return;
    }
    let s = serve_sample();
    let tmp = TempDir::new("unmount");
    let dir = mount_dir(&tmp);
    let m = Mount::spawn(s.handle.socket_path(), &dir, &MountOptions::default()).unwrap();
    let mut cat = Command::new("cat")
        .arg(dir.join("trace_pipe"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    m.unmount();
    let elapsed = start.elapsed();
    let status = cat.wait().unwrap();
    assert!(status.success(), "cat saw an error: {status}");
    assert!(
        elapsed < Duration::from_secs(1),
        "unmount waited {elapsed:?}"
    );
    assert!(mount_line(&dir).is_none());
}

/// The harness lists only tests: the processes these tests need run the sample server
/// binary, not this one in a hidden role that would count as a test that checks nothing.
#[test]
fn every_listed_test_is_a_test() {
    common::assert_only_tests_listed("a_killed_mount_server_is_cleaned_up_by_the_next_mount");
}
