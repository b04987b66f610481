//! Control files against the real kernel: the same bytes are written to (or read from) the
//! kernel's tracefs and ours, and acceptance, errno and read-back must agree.
//!
//! Covers `saved_cmdlines_size` bounds, reading `trace_marker`, instance-name limits and
//! `tracing_cpumask`. Only writes the kernel refuses go to its global files; everything
//! else happens in a private kernel instance, removed afterwards. Runs as root with
//! tracefs mounted; otherwise says `skipped: <why>` and passes.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use ustrace::{FileSystem, OpenFlags};

const TRACEFS: &str = "/sys/kernel/tracing";

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root, cannot write the kernel's tracefs".into());
    }
    if !Path::new(TRACEFS).join("instances").is_dir() {
        return Some(format!("no tracefs mounted at {TRACEFS}"));
    }
    None
}

macro_rules! skip_unless_kernel {
    () => {
        if let Some(why) = skip_reason() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// A private kernel instance, removed even when the test fails.
struct KernelInstance(PathBuf);

impl KernelInstance {
    fn create(tag: &str) -> KernelInstance {
        let dir = Path::new(TRACEFS).join(format!(
            "instances/ustrace-files-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).expect("mkdir kernel instance");
        KernelInstance(dir)
    }
}

impl Drop for KernelInstance {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// One write(2) of `data` to a kernel file opened for truncating write.
fn kernel_write(path: &Path, data: &[u8]) -> Result<(), i32> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(|e| e.raw_os_error().unwrap_or(0))?;
    file.write(data)
        .map(|_| ())
        .map_err(|e| e.raw_os_error().unwrap_or(0))
}

fn kernel_read(path: &Path) -> Result<String, i32> {
    let mut file = std::fs::File::open(path).map_err(|e| e.raw_os_error().unwrap_or(0))?;
    let mut out = String::new();
    file.read_to_string(&mut out)
        .map(|_| out)
        .map_err(|e| e.raw_os_error().unwrap_or(0))
}

fn our_write(path: &str, data: &[u8]) -> Result<(), i32> {
    let mut file = ustrace::tracefs()
        .open(path, OpenFlags::TRUNCATE)
        .map_err(|e| e.0)?;
    file.write(data).map(|_| ()).map_err(|e| e.0)
}

fn our_read(path: &str) -> Result<String, i32> {
    common::read(path).map_err(|e| e.0)
}

#[test]
fn saved_cmdlines_size_refuses_what_the_kernel_refuses() {
    skip_unless_kernel!();
    let kernel = Path::new(TRACEFS).join("saved_cmdlines_size");
    let before = kernel_read(&kernel).unwrap();
    // Only refused writes: an accepted one would resize (and empty) the kernel's table.
    for bad in [
        &b"0"[..],
        b"0\n",
        b"99999999999\n",
        b"32769\n",
        b"-1\n",
        b"abc\n",
        b"1x\n",
        b"18446744073709551616\n",
    ] {
        let k = kernel_write(&kernel, bad);
        let ours = our_write("saved_cmdlines_size", bad);
        assert!(
            k.is_err(),
            "the kernel took {bad:?}; this test must not resize it"
        );
        assert_eq!(ours, k, "saved_cmdlines_size <- {bad:?}");
    }
    assert_eq!(kernel_read(&kernel).unwrap(), before);
    assert_eq!(our_read("saved_cmdlines_size").unwrap(), "128\n");
}

#[test]
fn reading_trace_marker_fails_alike() {
    skip_unless_kernel!();
    let k = KernelInstance::create("marker");
    let kernel = kernel_read(&k.0.join("trace_marker"));
    assert_eq!(kernel, Err(libc::EINVAL), "kernel trace_marker read");
    assert_eq!(our_read("trace_marker"), kernel);
}

#[test]
fn instance_names_are_refused_alike() {
    skip_unless_kernel!();
    let fs = ustrace::tracefs();
    let pid = std::process::id();
    let names = [
        format!("{pid}{}", "x".repeat(256)),
        format!("{pid}{}", "y".repeat(255 - pid.to_string().len())),
        format!("{pid} with space"),
        format!("{pid}:colon*star"),
        format!("{pid}\ttab"),
    ];
    for name in &names {
        let dir = Path::new(TRACEFS).join("instances").join(name);
        let kernel = std::fs::create_dir(&dir).map_err(|e| e.raw_os_error().unwrap_or(0));
        if kernel.is_ok() {
            std::fs::remove_dir(&dir).unwrap();
        }
        let ours = fs.mkdir(&format!("instances/{name}")).map_err(|e| e.0);
        if ours.is_ok() {
            fs.rmdir(&format!("instances/{name}")).unwrap();
        }
        assert_eq!(ours, kernel, "mkdir instances/{name:?}");
    }
}

#[test]
fn tracing_cpumask_parses_and_prints_alike() {
    skip_unless_kernel!();
    let k = KernelInstance::create("cpumask");
    let fs = ustrace::tracefs();
    let ours = format!("instances/ustrace-files-cpumask-{}", std::process::id());
    let _ = fs.rmdir(&ours);
    fs.mkdir(&ours).unwrap();
    let kernel_file = k.0.join("tracing_cpumask");
    let our_file = format!("{ours}/tracing_cpumask");
    assert_eq!(
        our_read(&our_file),
        kernel_read(&kernel_file),
        "initial mask"
    );
    let mut cases: Vec<Vec<u8>> = [
        "1",
        "2\n",
        "0",
        "3",
        "f",
        "ff",
        "100",
        "0x1",
        "1,0",
        "00000000,00000001",
        "g",
        "",
        "\n",
        " 1",
        "1 ",
        "1\n\n",
        "0,1",
        ",1",
        "1,",
        "-1",
        "+1",
        "1\0x",
        "ffffffff",
        "1ffffffff",
        "00000001",
        "000000001",
        "1 2",
        "1,,",
        "ffffffff,ffffffff,ffffffff",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    cases.push(vec![b'1'; 5000]);
    cases.push(vec![b','; 4000]);
    let mut diffs = Vec::new();
    for case in &cases {
        let k = kernel_write(&kernel_file, case);
        let o = our_write(&our_file, case);
        let (kr, or) = (kernel_read(&kernel_file), our_read(&our_file));
        if k != o || kr != or {
            diffs.push(format!(
                "{:?}: kernel {k:?} -> {kr:?}, ours {o:?} -> {or:?}",
                String::from_utf8_lossy(&case[..case.len().min(40)])
            ));
        }
    }
    let _ = fs.rmdir(&ours);
    assert!(diffs.is_empty(), "{diffs:#?}");
}
