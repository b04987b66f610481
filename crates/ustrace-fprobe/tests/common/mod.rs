//! Shared helpers for the integration tests: build and load the C library of probed functions.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Builds tests/c/probed.c into a shared library (once per test binary) and dlopens it.
/// Returns None (with a `skipped:` note) when no C compiler is available.
pub fn c_lib() -> Option<&'static CLib> {
    static LIB: OnceLock<Option<CLib>> = OnceLock::new();
    LIB.get_or_init(|| build_and_load("probed", &["-O1"]))
        .as_ref()
}

pub struct CLib {
    pub handle: *mut libc::c_void,
    pub path: PathBuf,
}
// SAFETY: a dlopen handle is process-global and usable from any thread.
unsafe impl Send for CLib {}
// SAFETY: as above.
unsafe impl Sync for CLib {}

impl CLib {
    pub fn sym(&self, name: &str) -> usize {
        let c = std::ffi::CString::new(name).unwrap();
        // SAFETY: valid handle and NUL-terminated name.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        assert!(!p.is_null(), "symbol {name} missing from the test library");
        p as usize
    }
}

pub fn build_lib(stem: &str, out_name: &str, flags: &[&str]) -> Option<PathBuf> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{stem}.c"));
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).ok()?;
    let out = dir.join(format!("lib{out_name}.so"));
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-g", "-fcf-protection=full"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .arg("-lpthread")
        .status();
    match status {
        Ok(s) if s.success() => Some(out),
        other => {
            eprintln!("skipped: cannot build {}: {other:?}", src.display());
            None
        }
    }
}

/// This test process's directory for built libraries, under cargo's target tmp dir. The
/// libraries stay mapped (and are read back for symbols) until the process ends, so no test
/// can remove its own; instead, the directories of test processes that have ended are
/// removed here.
fn scratch_dir() -> PathBuf {
    const PREFIX: &str = "fprobe-tests-";
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let me = std::process::id();
    for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if pid != me && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    base.join(format!("{PREFIX}{me}"))
}

pub fn build_and_load(stem: &str, flags: &[&str]) -> Option<CLib> {
    let path = build_lib(stem, stem, flags)?;
    let c = std::ffi::CString::new(path.to_str()?).ok()?;
    // SAFETY: loading a library we just built.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!handle.is_null(), "dlopen {} failed", path.display());
    Some(CLib { handle, path })
}

pub fn stress_secs(default: f64) -> f64 {
    std::env::var("USTRACE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}
