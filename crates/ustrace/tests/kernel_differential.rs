//! The whole stack against the real kernel: the same filter and trigger writes go to the
//! kernel's `raw_syscalls/sys_enter` (in a private instance, removed afterwards) and to a
//! ustrace event with the same fields through our tracefs; acceptance, errno, the `filter`
//! read-back and the `trigger` listing must agree.
//!
//! Runs as root with tracefs mounted; otherwise says `skipped: <why>` and passes. The corpus
//! is ustrace-filter's (`tests/corpus/*.txt`), plus generated cases (`USTRACE_DIFF_CASES`).
//!
//! Every case ends as identical, exempted (with its reason) or different, counted apart; any
//! difference fails. A case is exempted only by what both sides answered, never by its text:
//! the kernel refused a trigger command that its own help line does not list (this kernel is
//! built without the snapshot trigger), or it accepted a `.function` filter whose symbol is
//! in kallsyms while ours refused it as "Function not found" at that symbol (kernel symbols do
//! not exist in this process). Our output is compared as it is read: the trigger help line
//! (`# Available triggers:`) is checked once on its own against the commands each side
//! accepts, and a kernel trigger count may only be lower than ours, since the kernel's
//! sys_enter fires on every system call of the machine and runs its counts down.

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

/// How one case ended.
enum Outcome {
    Identical,
    Exempt(String),
    Different,
}

/// The commands a trigger file's help text (`# Available triggers:` then `# cmd cmd ...`)
/// lists; `None` when the file lists triggers instead.
fn help_commands(listing: &str) -> Option<Vec<String>> {
    let mut lines = listing.lines();
    if lines.next()? != "# Available triggers:" {
        return None;
    }
    let cmds = lines.next()?.strip_prefix("# ")?;
    Some(cmds.split_whitespace().map(String::from).collect())
}

/// The command a trigger write names: the first word, after a removing `!`.
fn command_word(text: &str) -> &str {
    let t = text.trim_start();
    let t = t.strip_prefix('!').unwrap_or(t).trim_start();
    let end = t
        .find(|c: char| c == ':' || c.is_whitespace())
        .unwrap_or(t.len());
    &t[..end]
}

/// One listing line of each side agree: the same text, except that the kernel's `count=K` may
/// be below ours (its sys_enter fires and runs counts down; ours is never fired here).
fn trigger_line_agrees(kernel: &str, ours: &str) -> bool {
    if kernel == ours {
        return true;
    }
    let (Some(ka), Some(oa)) = (kernel.find(":count="), ours.find(":count=")) else {
        return false;
    };
    let split = |line: &str, at: usize| {
        let rest = &line[at + ":count=".len()..];
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        (
            line[..at].to_string(),
            rest[..end].parse::<u64>().ok(),
            rest[end..].to_string(),
        )
    };
    let (kp, kc, ks) = split(kernel, ka);
    let (op, oc, os) = split(ours, oa);
    matches!((kc, oc), (Some(k), Some(o)) if k <= o) && kp == op && ks == os
}

/// Two trigger listings agree: both the help text (checked on its own, once) or both the
/// same trigger lines.
fn trigger_listings_agree(kernel: &str, ours: &str) -> bool {
    match (help_commands(kernel), help_commands(ours)) {
        (Some(_), Some(_)) => true,
        (None, None) => {
            let (k, o): (Vec<_>, Vec<_>) = (kernel.lines().collect(), ours.lines().collect());
            k.len() == o.len() && k.iter().zip(&o).all(|(k, o)| trigger_line_agrees(k, o))
        }
        _ => false,
    }
}

/// Whether `/proc/kallsyms` names a function `name`.
fn in_kallsyms(name: &str) -> bool {
    std::fs::read_to_string("/proc/kallsyms").is_ok_and(|all| {
        all.lines().any(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, sym) = (f.next(), f.next(), f.next());
            matches!(kind, Some("T" | "t")) && sym == Some(name)
        })
    })
}

/// The reason a filter case may differ, from what the two sides answered: the kernel took a
/// `.function` comparison and ours refused it as "Function not found", its caret just past a
/// name that kallsyms has (kernel functions are not symbols of this process).
fn filter_exemption(
    text: &str,
    kernel: &Result<(), Errno>,
    kernel_readback: &str,
    ours: &Result<(), Errno>,
    ours_readback: &str,
) -> Option<String> {
    if kernel.is_err() || *ours != Err(Errno::EINVAL) || kernel_readback.trim_end() != text {
        return None;
    }
    let mut lines = ours_readback.lines();
    let (echo, caret, message) = (lines.next()?, lines.next()?, lines.next()?);
    if echo != text || message != "parse_error: Function not found" {
        return None;
    }
    // The caret stands just past the operand that did not resolve, as the kernel places it.
    let at = caret.find('^')?;
    let before = echo.get(..at.min(echo.len()))?.trim_end();
    let start = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    let name = &before[start..];
    if !name.is_empty() && in_kallsyms(name) {
        Some(format!(
            ".function symbol `{name}`: in kallsyms, not in this process"
        ))
    } else {
        None
    }
}

/// The trigger help lines checked on their own: ours lists every command the kernel lists,
/// in the kernel's order, and each command only we list is one the kernel refuses and we
/// accept. Returns the commands only we have.
fn check_help_lines(kernel: &KernelInstance, ours: &Ours) -> Vec<String> {
    let kernel_cmds = help_commands(&kernel.read("trigger")).expect("kernel help line");
    let our_cmds = help_commands(&ours.read("trigger")).expect("our help line");
    let mut ours_iter = our_cmds.iter();
    for cmd in &kernel_cmds {
        assert!(
            ours_iter.any(|c| c == cmd),
            "help lines: the kernel lists {kernel_cmds:?}, we list {our_cmds:?}: `{cmd}` missing or out of order"
        );
    }
    let extra: Vec<String> = our_cmds
        .iter()
        .filter(|c| !kernel_cmds.contains(c))
        .cloned()
        .collect();
    for cmd in &extra {
        // The hist commands take parameters (a kernel with them refuses the bare word).
        let write = match cmd.as_str() {
            "enable_hist" | "disable_hist" => format!("{cmd}:sched:sched_switch"),
            "hist" => "hist:keys=id".to_string(),
            _ => cmd.clone(),
        };
        assert_eq!(
            kernel.write("trigger", &write),
            Err(Errno::EINVAL),
            "we list `{cmd}` that the kernel lacks: the kernel must refuse it"
        );
        assert_eq!(
            ours.write("trigger", &write),
            Ok(()),
            "we list `{cmd}` in our help line but refuse it"
        );
        kernel.clear_triggers();
        ours.clear_triggers();
    }
    eprintln!(
        "trigger help lines: kernel {kernel_cmds:?}, ours {our_cmds:?}; only ours (kernel EINVAL, ours accepted): {extra:?}"
    );
    extra
}

/// Tallies of a run, reported apart.
#[derive(Default)]
struct Tally {
    total: usize,
    identical: usize,
    exempt: Vec<(String, usize)>,
    different: Vec<String>,
}

impl Tally {
    fn add(&mut self, outcome: Outcome, describe: impl FnOnce() -> String) {
        self.total += 1;
        match outcome {
            Outcome::Identical => self.identical += 1,
            Outcome::Exempt(why) => match self.exempt.iter_mut().find(|(w, _)| *w == why) {
                Some((_, n)) => *n += 1,
                None => self.exempt.push((why, 1)),
            },
            Outcome::Different => self.different.push(describe()),
        }
    }
}

#[test]
fn filters_and_triggers_agree_with_the_kernel_through_tracefs() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let kernel = KernelInstance::create();
    let ours = Ours::create();
    let only_ours = check_help_lines(&kernel, &ours);
    let mut tally = Tally::default();

    let mut filters = corpus("filters.txt");
    filters.extend(generated(filter_common::maybe_broken_expression()));
    for text in &filters {
        let k = kernel.write("filter", text);
        let o = ours.write("filter", text);
        let (kt, ot) = (kernel.read("filter"), ours.read("filter"));
        let outcome = if k == o && kt == ot {
            Outcome::Identical
        } else if let Some(why) = filter_exemption(text, &k, &kt, &o, &ot) {
            Outcome::Exempt(why)
        } else if let Some(why) = (k.is_ok() && o == Err(Errno::EINVAL))
            .then(|| filter_common::incomplete_expression(text))
            .flatten()
        {
            Outcome::Exempt(why.to_string())
        } else {
            Outcome::Different
        };
        tally.add(outcome, || {
            format!("filter {text:?}: kernel {k:?} {kt:?} / ours {o:?} {ot:?}")
        });
        let _ = kernel.write("filter", "0");
        let _ = ours.write("filter", "0");
    }

    let mut triggers = corpus("triggers.txt");
    triggers.extend(generated(filter_common::trigger_text()));
    for text in &triggers {
        let k = kernel.write("trigger", text);
        let o = ours.write("trigger", text);
        let (kt, ot) = (kernel.read("trigger"), ours.read("trigger"));
        let cmd = command_word(text);
        let outcome = if k == o && trigger_listings_agree(&kt, &ot) {
            Outcome::Identical
        } else if k == Err(Errno::EINVAL)
            && help_commands(&kt).is_some()
            && only_ours.iter().any(|c| c == cmd)
        {
            Outcome::Exempt(format!(
                "trigger `{cmd}`: the kernel lacks it (EINVAL, not in its help line)"
            ))
        } else if let Some(why) = (k.is_ok() && o == Err(Errno::EINVAL))
            .then(|| ustrace_filter::trigger::parse(text).ok()?.filter)
            .flatten()
            .and_then(|f| filter_common::incomplete_expression(&f))
        {
            Outcome::Exempt(why.to_string())
        } else {
            Outcome::Different
        };
        tally.add(outcome, || {
            format!("trigger {text:?}: kernel {k:?} {kt:?} / ours {o:?} {ot:?}")
        });
        kernel.clear_triggers();
        ours.clear_triggers();
    }
    let exempt: usize = tally.exempt.iter().map(|(_, n)| n).sum();
    eprintln!(
        "kernel differential: {} cases: {} identical, {exempt} exempted, {} different",
        tally.total,
        tally.identical,
        tally.different.len()
    );
    for (why, n) in &tally.exempt {
        eprintln!("  exempted {n}: {why}");
    }
    assert_eq!(
        tally.identical + exempt + tally.different.len(),
        tally.total
    );
    assert!(
        tally.different.is_empty(),
        "different:\n{}",
        tally.different.join("\n")
    );
}

#[test]
fn trigger_listing_comparison_rules() {
    assert!(trigger_line_agrees("traceon:count=3", "traceon:count=5"));
    assert!(!trigger_line_agrees("traceon:count=5", "traceon:count=3"));
    assert!(!trigger_line_agrees(
        "traceon:count=3 if id == 1",
        "traceon:count=5 if id == 2"
    ));
    assert!(!trigger_line_agrees("traceon:unlimited", "traceon:count=1"));
    let help = "# Available triggers:\n# traceon traceoff stacktrace\n";
    assert!(trigger_listings_agree(help, help));
    assert!(!trigger_listings_agree(help, "traceon:unlimited\n"));
    assert_eq!(command_word("! snapshot:1 if id > 1"), "snapshot");
    assert_eq!(command_word("  traceon  "), "traceon");
    assert_eq!(command_word("enable_event:sched:x"), "enable_event");
}
