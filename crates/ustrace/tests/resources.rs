//! What tracefs writes cost in memory, mappings and file descriptors: buffer sizes that
//! cannot be backed fail with the kernel's `ENOMEM` (and never panic), and taking and
//! freeing snapshots, resizing and making and removing instances over and over hold no
//! more than the first few rounds did.
//!
//! The tests count the whole process's files and mappings, so they run one at a time and
//! nothing else in this test binary makes buffers.

mod common;

use common::{read, write};
use std::sync::Mutex;
use ustrace::{Errno, FileSystem};

static ALONE: Mutex<()> = Mutex::new(());

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

/// Mappings of files (buffers live in shm files and memfds). Anonymous ones are left out:
/// a runtime thread that allocates for the first time gets a malloc arena of its own (two
/// anonymous mappings) whenever it happens to, which a loaded CI machine once put between
/// the two counts of a test.
fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("read /proc/self/maps")
        .lines()
        .filter(|line| {
            line.split_whitespace()
                .nth(5)
                .is_some_and(|path| path.starts_with('/') || path.starts_with("memfd:"))
        })
        .count()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("read /proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

fn instance(name: &str) -> String {
    let _ = ustrace::tracefs().rmdir(&format!("instances/{name}"));
    ustrace::tracefs()
        .mkdir(&format!("instances/{name}"))
        .unwrap();
    format!("instances/{name}")
}

#[test]
fn sizes_that_cannot_be_backed_fail_with_enomem_and_change_nothing() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = instance("res_sizes");
    write(&format!("{dir}/trace_marker"), "kept\n").unwrap();
    let size = read(&format!("{dir}/buffer_size_kb")).unwrap();
    let (fds, maps) = (open_fds(), mappings());
    for file in ["buffer_size_kb", "per_cpu/cpu0/buffer_size_kb"] {
        let path = format!("{dir}/{file}");
        // As on the kernel: 0 and words are EINVAL, past u64 ERANGE, too big ENOMEM.
        for (text, errno) in [
            ("0", Errno::EINVAL),
            ("abc", Errno::EINVAL),
            ("18446744073709551616", Errno(libc::ERANGE)),
            ("4294967296", Errno::ENOMEM),
            ("268435456", Errno::ENOMEM),
            ("1048577", Errno::ENOMEM),
            // The kernel wraps this one to its smallest buffer (2^54 KiB is 2^64 bytes);
            // it used to overflow `kb * 1024` and panic the writing thread in a debug build.
            ("18014398509481984", Errno::ENOMEM),
            ("18446744073709551615", Errno::ENOMEM),
        ] {
            assert_eq!(
                write(&path, &format!("{text}\n")),
                Err(errno),
                "{path} {text}"
            );
        }
    }
    assert_eq!(read(&format!("{dir}/buffer_size_kb")).unwrap(), size);
    assert!(read(&format!("{dir}/trace")).unwrap().contains("kept"));
    assert_eq!(
        (open_fds(), mappings()),
        (fds, maps),
        "nothing opened or mapped"
    );
    ustrace::tracefs().rmdir(&dir).unwrap();
}

#[test]
fn snapshot_on_and_off_keeps_the_file_count() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = instance("res_snapshot");
    let cycle = |k: usize| {
        write(&format!("{dir}/trace_marker"), &format!("round {k}\n")).unwrap();
        write(&format!("{dir}/snapshot"), "1\n").unwrap();
        write(&format!("{dir}/snapshot"), "0\n").unwrap();
    };
    for k in 0..5 {
        cycle(k);
    }
    let (fds, maps) = (open_fds(), mappings());
    for k in 0..200 {
        cycle(k);
    }
    let (fds_after, maps_after) = (open_fds(), mappings());
    eprintln!("200 snapshot cycles: fds {fds} -> {fds_after}, mappings {maps} -> {maps_after}");
    assert!(fds_after <= fds + 1, "fds went from {fds} to {fds_after}");
    assert!(
        maps_after <= maps + 4,
        "mappings went from {maps} to {maps_after}"
    );
    ustrace::tracefs().rmdir(&dir).unwrap();
}

#[test]
fn resize_and_instance_churn_stays_bounded() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let top = instance("res_churn");
    let round = |k: usize| {
        // Grow and shrink with events nobody reads, as a shell does.
        for kb in ["4096", "64", "1410"] {
            write(&format!("{top}/trace_marker"), &format!("k={k}\n")).unwrap();
            write(&format!("{top}/buffer_size_kb"), kb).unwrap();
        }
        write(&format!("{top}/snapshot"), "1").unwrap();
        write(&format!("{top}/snapshot"), "0").unwrap();
        // And an instance made, used, resized and removed.
        let dir = instance("res_churn_tmp");
        write(&format!("{dir}/trace_marker"), "x\n").unwrap();
        write(&format!("{dir}/buffer_size_kb"), "256").unwrap();
        ustrace::tracefs().rmdir(&dir).unwrap();
    };
    for k in 0..20 {
        round(k);
    }
    let before = (rss_kib(), mappings(), open_fds());
    const ROUNDS: usize = 200;
    for k in 0..ROUNDS {
        round(k);
    }
    let after = (rss_kib(), mappings(), open_fds());
    eprintln!(
        "{ROUNDS} rounds: VmRSS {} -> {} KiB, mappings {} -> {}, fds {} -> {}",
        before.0, after.0, before.1, after.1, before.2, after.2
    );
    assert!(
        after.2 <= before.2 + 2,
        "fds went from {} to {}",
        before.2,
        after.2
    );
    assert!(
        after.1 <= before.1 + 8,
        "mappings went from {} to {}",
        before.1,
        after.1
    );
    assert!(
        after.0 <= before.0 + 4096,
        "VmRSS grew from {} to {} KiB",
        before.0,
        after.0
    );
    ustrace::tracefs().rmdir(&top).unwrap();
}
