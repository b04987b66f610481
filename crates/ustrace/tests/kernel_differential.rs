//! The whole stack against the real kernel: the same filter and trigger writes go to the
//! kernel's `raw_syscalls/sys_enter` (in a private instance, removed afterwards) and to a
//! ustrace event with the same fields through our tracefs; acceptance, errno, the `filter`
//! read-back and the `trigger` listing must agree.
//!
//! Runs as root with tracefs mounted; otherwise says `skipped: <why>` and passes. The corpus
//! is ustrace-filter's (`tests/corpus/*.txt`), plus generated cases (`USTRACE_DIFF_CASES`).
//! Known, explained differences are listed in `explained_difference`.

mod common;
#[path = "../../ustrace-filter/tests/common/mod.rs"]
mod filter_common;

use std::path::{Path, PathBuf};

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use ustrace::{Errno, FileSystem};

ustrace::trace_event! {
    pub fn raw_syscalls::sys_enter(id: isize, args: [usize; 6]) {
        id: isize = id,
        args: [usize; 6] = args,
    }
    print "NR %ld (%lx, %lx, %lx, %lx, %lx, %lx)", id, args;
}

ustrace::trace_event! {
    pub fn raw_syscalls::sys_exit(id: isize, ret: isize) {
        id: isize = id,
        ret: isize = ret,
    }
    print "NR %ld = %ld", id, ret;
}

ustrace::trace_event! {
    pub fn sched::sched_switch(prev_pid: i32, next_pid: i32) {
        prev_pid: i32 = prev_pid,
        next_pid: i32 = next_pid,
    }
    print "prev_pid=%d next_pid=%d", prev_pid, next_pid;
}

ustrace::trace_event! {
    pub fn sched::sched_waking(pid: i32) {
        pid: i32 = pid,
    }
    print "pid=%d", pid;
}

ustrace::trace_event! {
    pub fn sched::sched_wakeup(pid: i32) {
        pid: i32 = pid,
    }
    print "pid=%d", pid;
}

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

/// A private kernel instance, removed even when the test fails.
struct KernelInstance(PathBuf);

impl KernelInstance {
    fn create() -> KernelInstance {
        let dir = Path::new(TRACEFS).join(format!(
            "instances/ustrace-core-diff-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).expect("mkdir kernel instance");
        KernelInstance(dir)
    }
    fn file(&self, p: &str) -> PathBuf {
        self.0.join("events/raw_syscalls/sys_enter").join(p)
    }
    /// One write(2), even of nothing: an empty write is a command too (the kernel's filter
    /// file answers it with EINVAL), and `write_all` would skip it.
    fn write(&self, p: &str, text: &str) -> Result<(), Errno> {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(self.file(p))
            .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?;
        // SAFETY: writes from a live buffer of the given length to an open descriptor.
        let n = unsafe { libc::write(f.as_raw_fd(), text.as_ptr().cast(), text.len()) };
        if n < 0 {
            return Err(Errno(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
            ));
        }
        Ok(())
    }
    /// One large read: the kernel's `filter` file answers only a read at offset 0, so the
    /// small first read of `read_to_string` would cut it.
    fn read(&self, p: &str) -> String {
        use std::io::Read;
        let mut f = std::fs::File::open(self.file(p)).expect("open kernel file");
        let mut buf = vec![0u8; 64 * 1024];
        let mut out = Vec::new();
        loop {
            let n = f.read(&mut buf).expect("read kernel file");
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    fn clear_triggers(&self) {
        for line in self.read("trigger").lines().filter(|l| !l.starts_with('#')) {
            let _ = self.write("trigger", &format!("!{}", line.split('[').next().unwrap()));
        }
    }
}

impl Drop for KernelInstance {
    fn drop(&mut self) {
        self.clear_triggers();
        let _ = self.write("filter", "0");
        let _ = std::fs::remove_dir(&self.0);
    }
}

struct Ours(String);

impl Ours {
    fn create() -> Ours {
        let name = "core-diff".to_string();
        let _ = ustrace::tracefs().rmdir(&format!("instances/{name}"));
        ustrace::tracefs()
            .mkdir(&format!("instances/{name}"))
            .unwrap();
        Ours(name)
    }
    fn path(&self, p: &str) -> String {
        format!("instances/{}/events/raw_syscalls/sys_enter/{p}", self.0)
    }
    fn write(&self, p: &str, text: &str) -> Result<(), Errno> {
        common::write(&self.path(p), text)
    }
    fn read(&self, p: &str) -> String {
        common::read(&self.path(p)).unwrap()
    }
    fn clear_triggers(&self) {
        for line in self.read("trigger").lines().filter(|l| !l.starts_with('#')) {
            let _ = self.write("trigger", &format!("!{}", line.split('[').next().unwrap()));
        }
    }
}

impl Drop for Ours {
    fn drop(&mut self) {
        let _ = ustrace::tracefs().rmdir(&format!("instances/{}", self.0));
    }
}

fn corpus(name: &str) -> Vec<String> {
    let path = format!(
        "{}/../ustrace-filter/tests/corpus/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
        .lines()
        .filter(|l| !l.starts_with("## "))
        .map(filter_common::unescape)
        .collect()
}

fn generated<S: Strategy<Value = String>>(strategy: S) -> Vec<String> {
    let n = std::env::var("USTRACE_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut runner = TestRunner::deterministic();
    (0..n)
        .map(|_| strategy.new_tree(&mut runner).expect("strategy").current())
        .collect()
}

/// A trigger listing with its counts blanked: the kernel's sys_enter fires on every system
/// call of the machine (triggers run in soft mode too), so its counts run down while ours,
/// whose event nobody fires, stay put.
fn without_counts(listing: &str) -> String {
    listing
        .lines()
        .map(|line| match line.find(":count=") {
            Some(at) => {
                let rest = &line[at + ":count=".len()..];
                let end = rest
                    .find(|c: char| !c.is_ascii_digit() && c != '-')
                    .unwrap_or(rest.len());
                format!("{}:count=N{}", &line[..at], &rest[end..])
            }
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Differences we keep on purpose.
fn explained_difference(text: &str, _kernel: &str, _ours: &str) -> Option<&'static str> {
    // This kernel is built without CONFIG_TRACER_SNAPSHOT, so it has no `snapshot` trigger;
    // we have one, so `snapshot` writes are accepted here.
    if text.contains("snapshot") {
        return Some("the kernel has no snapshot trigger (CONFIG_TRACER_SNAPSHOT off)");
    }
    // `.function` names a kernel function to the kernel (kallsyms) and a function of this
    // process to us; `schedule` exists only in the kernel.
    if text.contains(".function") {
        return Some(".function resolves kallsyms on the kernel, this process's symbols here");
    }
    // hist triggers are a later issue; this kernel has none either.
    if text.contains("hist") {
        return Some("no hist triggers yet (nor on this kernel)");
    }
    None
}

#[test]
fn filters_and_triggers_agree_with_the_kernel_through_tracefs() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let kernel = KernelInstance::create();
    let ours = Ours::create();
    let (mut same, mut explained, mut total) = (0usize, 0usize, 0usize);
    let mut failures = Vec::new();

    let mut filters = corpus("filters.txt");
    filters.extend(generated(filter_common::maybe_broken_expression()));
    for text in &filters {
        total += 1;
        let k = kernel.write("filter", text);
        let o = ours.write("filter", text);
        let (kt, ot) = (kernel.read("filter"), ours.read("filter"));
        if k == o && kt == ot {
            same += 1;
        } else if let Some(_why) = explained_difference(text, &kt, &ot) {
            explained += 1;
        } else {
            failures.push(format!(
                "filter {text:?}: kernel {k:?} {kt:?} / ours {o:?} {ot:?}"
            ));
        }
        let _ = kernel.write("filter", "0");
        let _ = ours.write("filter", "0");
    }

    let mut triggers = corpus("triggers.txt");
    triggers.extend(generated(filter_common::trigger_text()));
    for text in &triggers {
        total += 1;
        let k = kernel.write("trigger", text);
        let o = ours.write("trigger", text);
        // Our help line lists `snapshot`, which this kernel lacks (see explained_difference).
        let ours_listing = ours
            .read("trigger")
            .replace(" snapshot stacktrace", " stacktrace");
        let (kt, ot) = (
            without_counts(&kernel.read("trigger")),
            without_counts(&ours_listing),
        );
        if k == o && kt == ot {
            same += 1;
        } else if let Some(_why) = explained_difference(text, &kt, &ot) {
            explained += 1;
        } else {
            failures.push(format!(
                "trigger {text:?}: kernel {k:?} {kt:?} / ours {o:?} {ot:?}"
            ));
        }
        kernel.clear_triggers();
        ours.clear_triggers();
    }
    eprintln!(
        "kernel differential: {same}/{total} identical, {explained} explained, {} unexplained ({:.1}% agreement)",
        failures.len(),
        100.0 * (same + explained) as f64 / total as f64
    );
    assert!(
        failures.is_empty(),
        "disagreements:\n{}",
        failures.join("\n")
    );
}
