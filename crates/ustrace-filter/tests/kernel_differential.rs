//! Differential test against the live kernel: every filter and trigger text of
//! the corpus (tests/corpus/*.txt) plus proptest-generated ones is written to
//! `raw_syscalls/sys_enter` in a private tracefs instance and handed to this
//! crate; acceptance, errno, the `filter` read-back (message and caret), the
//! `error_log` entry and the `trigger` listing must agree.
//!
//! A third test does the same for filters on events with string, `char *`,
//! `__data_loc` and cpumask fields, their field tables read from `format`.
//!
//! Needs root and tracefs at /sys/kernel/tracing; otherwise prints
//! `skipped: <why>` and passes. `USTRACE_DIFF_CASES=N` sets how many generated
//! cases of each kind to add (default 300).

mod common;

use common::{
    corpus, incomplete_expression, maybe_broken_expression, mutated, trigger_text, SYS_ENTER,
};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use ustrace_filter::trigger::{self, available_triggers_text};
use ustrace_filter::{compile, is_clear, possible_cpus, CompileEnv};

const TRACEFS: &str = "/sys/kernel/tracing";

/// Disagreements that are understood and accepted, with the reason.
const EXPLAINED: &[(&str, &str)] = &[];

/// A private tracefs instance, removed on drop (also when a test panics).
struct Instance {
    dir: PathBuf,
}

impl Instance {
    fn create(name: &str) -> std::io::Result<Instance> {
        let dir = Path::new(TRACEFS).join("instances").join(name);
        fs::create_dir(&dir)?;
        Ok(Instance { dir })
    }

    fn event_file(&self, name: &str) -> PathBuf {
        self.dir.join("events/raw_syscalls/sys_enter").join(name)
    }

    fn clear_triggers(&self) {
        for _ in 0..16 {
            let listing = read(&self.event_file("trigger"));
            if listing.starts_with('#') {
                return;
            }
            for line in listing.lines() {
                let cmd = line.split(" if ").next().unwrap_or("");
                let parts: Vec<&str> = cmd.split(':').collect();
                let removal = if parts[0].contains("_event") || parts[0].contains("_hist") {
                    parts[..3.min(parts.len())].join(":")
                } else {
                    parts[0].to_string()
                };
                let _ = write(&self.event_file("trigger"), &format!("!{removal}"));
            }
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.clear_triggers();
        let _ = write(&self.event_file("filter"), "0");
        let _ = write(&self.event_file("enable"), "0");
        if let Err(e) = fs::remove_dir(&self.dir) {
            eprintln!("could not remove {}: {e}", self.dir.display());
        }
    }
}

/// One `write(2)` of the whole text; the errno, 0 on success.
fn write(path: &Path, text: &str) -> i32 {
    let mut f = match OpenOptions::new().write(true).open(path) {
        Ok(f) => f,
        Err(e) => return e.raw_os_error().unwrap_or(-1),
    };
    match f.write(text.as_bytes()) {
        // tracefs takes a whole command per write or fails it.
        Ok(n) if n == text.len() => 0,
        Ok(_) => -1,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

/// The file's content. The `filter` file answers only the first `read(2)`
/// (later ones return 0), so read once into a buffer larger than a page,
/// then drain for files that do support continuation.
fn read(path: &Path) -> String {
    let mut f = fs::File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let mut bytes = vec![0u8; 1 << 16];
    let n = f
        .read(&mut bytes)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    bytes.truncate(n);
    let mut more = Vec::new();
    let _ = f.read_to_end(&mut more);
    bytes.extend_from_slice(&more);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Symbol table from /proc/kallsyms for `.function`.
struct Kallsyms {
    by_addr: Vec<(u64, String)>,
}

impl Kallsyms {
    fn load() -> Kallsyms {
        let text = fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        let mut by_addr: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let _kind = it.next()?;
                Some((addr, it.next()?.to_string()))
            })
            .filter(|(a, _)| *a != 0)
            .collect();
        by_addr.sort();
        Kallsyms { by_addr }
    }

    fn range_at(&self, idx: usize) -> Option<Range<u64>> {
        let start = self.by_addr[idx].0;
        let end = self.by_addr[idx..]
            .iter()
            .map(|s| s.0)
            .find(|&a| a > start)?;
        Some(start..end)
    }

    fn function(&self, name: &str) -> Option<Range<u64>> {
        let idx = self.by_addr.iter().position(|(_, n)| n == name)?;
        self.range_at(idx)
    }

    fn address(&self, addr: u64) -> Option<Range<u64>> {
        let idx = self
            .by_addr
            .partition_point(|s| s.0 <= addr)
            .checked_sub(1)?;
        self.range_at(idx)
    }
}

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !Path::new(TRACEFS).join("instances").is_dir() {
        return Some(format!("tracefs not mounted at {TRACEFS}"));
    }
    None
}

fn generated<S: Strategy<Value = String>>(strategy: S, n: usize) -> Vec<String> {
    let mut runner = TestRunner::deterministic();
    (0..n)
        .map(|_| strategy.new_tree(&mut runner).expect("strategy").current())
        .collect()
}

fn cases() -> usize {
    std::env::var("USTRACE_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// `text` followed by blanks up to `len` bytes.
fn padded(text: &str, len: usize) -> String {
    format!("{text}{}", " ".repeat(len - text.len()))
}

fn strip_log_timestamp(log: &str) -> String {
    match log.find("] ") {
        Some(i) if log.starts_with('[') => log[i + 2..].trim_end_matches('\n').to_string(),
        _ => log.trim_end_matches('\n').to_string(),
    }
}

#[test]
fn filters_agree_with_the_kernel() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let inst = Instance::create(&format!("ustrace-difftest-{}", std::process::id()))
        .expect("creating a tracefs instance");
    let syms = Kallsyms::load();
    let by_name = |n: &str| syms.function(n);
    let by_addr = |a: u64| syms.address(a);
    let env = CompileEnv {
        resolve_function: Some(&by_name),
        resolve_address: Some(&by_addr),
        nr_cpus: possible_cpus(),
    };
    let mut texts = corpus("filters.txt");
    texts.extend(generated(maybe_broken_expression(), cases()));
    texts.extend(generated(mutated(corpus("filters.txt")), cases()));
    // Near the kernel's buffer limits (see ustrace_filter::SEQ_LIMIT).
    for n in [
        2000, 4059, 4060, 4061, 4062, 4074, 4075, 4076, 4077, 4094, 4095, 4096, 5000,
    ] {
        texts.push("x".repeat(n));
        texts.push(format!("{} y", "x".repeat(n)));
    }
    // A page or more is refused on its size, however blank its tail (the
    // write is then expected to leave `id == 12345` in force and shown).
    for n in [4095, 4096, 4097] {
        for text in ["id == 1", "xx == 1", "0", "id == 1\0"] {
            texts.push(padded(text, n));
        }
    }
    texts.push("()".repeat(2047));
    texts.push(format!("id == 1 && {}", "(".repeat(4000)));
    let filter = inst.event_file("filter");
    let error_log = inst.dir.join("error_log");
    texts.retain(|t| !is_clear(t));
    let mut agree = 0usize;
    let mut failures = Vec::new();
    for text in &texts {
        // A known filter first, so a refused write shows it was left alone.
        assert_eq!(write(&filter, "id == 12345"), 0);
        let _ = fs::write(&error_log, "");
        let k_errno = write(&filter, text);
        let k_file = read(&filter);
        let k_log = strip_log_timestamp(&read(&error_log));
        let (m_errno, m_file, m_log) = match compile(text, &SYS_ENTER, &env) {
            Ok(p) => (0, format!("{}\n", p.text()), String::new()),
            Err(e) if e.is_write_too_long() => {
                (e.errno(), "id == 12345\n".to_string(), String::new())
            }
            Err(e) => {
                let (first, rest) = e.error_log_entry(text);
                (
                    e.errno(),
                    e.filter_file_text(text),
                    format!("{first}\n{rest}"),
                )
            }
        };
        if (k_errno, &k_file, &k_log) == (m_errno, &m_file, &m_log) {
            agree += 1;
        } else if let Some(why) = (k_errno == 0 && m_errno == 22)
            .then(|| incomplete_expression(text))
            .flatten()
        {
            eprintln!("explained disagreement for {text:?}: {why}");
            agree += 1;
        } else if let Some((_, why)) = EXPLAINED.iter().find(|(t, _)| t == text) {
            eprintln!("explained disagreement for {text:?}: {why}");
            agree += 1;
        } else {
            let short = |t: &str| {
                if t.len() > 300 {
                    format!("{}...({} bytes)", &t[..300], t.len())
                } else {
                    t.to_string()
                }
            };
            failures.push(format!(
                "{}\n  kernel: errno {k_errno}\n{}{}\n  ours:   errno {m_errno}\n{}{}",
                short(&format!("{text:?}")),
                short(&k_file),
                short(&k_log),
                short(&m_file),
                short(&m_log)
            ));
        }
    }
    eprintln!(
        "filter agreement: {agree}/{} ({:.1}%)",
        texts.len(),
        100.0 * agree as f64 / texts.len() as f64
    );
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn triggers_agree_with_the_kernel() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let inst = Instance::create(&format!("ustrace-difftest-trig-{}", std::process::id()))
        .expect("creating a tracefs instance");
    let trig = inst.event_file("trigger");
    let help = read(&trig);
    let available: Vec<String> = help
        .lines()
        .nth(1)
        .expect("help text second line")
        .trim_start_matches('#')
        .split_whitespace()
        .map(String::from)
        .collect();
    let available: Vec<&str> = available.iter().map(String::as_str).collect();
    assert_eq!(help, available_triggers_text(&available));
    let env = CompileEnv::default();
    let events = inst.dir.join("events");
    let mut texts = corpus("triggers.txt");
    texts.extend(generated(trigger_text(), cases()));
    texts.extend(generated(mutated(corpus("triggers.txt")), cases()));
    for n in [4095, 4096, 4097] {
        for text in [
            "traceoff:5",
            "traceoff:5 if id == 1",
            "traceoff:5 if xx == 1",
            "!traceoff",
        ] {
            texts.push(padded(text, n));
        }
    }
    let mut agree = 0usize;
    let mut failures = Vec::new();
    for text in &texts {
        inst.clear_triggers();
        let k_errno = write(&trig, text);
        let k_list = read(&trig);
        let (m_errno, m_list) = if text.is_empty() {
            // A zero-length write never reaches the parser.
            (0, help.clone())
        } else {
            match trigger::parse_with(text, &available) {
                Err(e) => (e.errno(), help.clone()),
                Ok(cmd) => {
                    let target_ok = cmd.kind.target().is_none_or(|(s, e)| {
                        !s.is_empty()
                            && !e.is_empty()
                            && ![s, e]
                                .iter()
                                .any(|x| x.contains('/') || *x == "." || *x == "..")
                            && events.join(s).join(e).join("trigger").exists()
                    });
                    if !target_ok {
                        (22, help.clone())
                    } else if cmd.remove {
                        (0, help.clone())
                    } else {
                        let compiled = cmd.filter.as_deref().map(|f| compile(f, &SYS_ENTER, &env));
                        match compiled {
                            Some(Err(e)) => (e.errno(), help.clone()),
                            _ => (0, format!("{}\n", cmd.listing(cmd.count))),
                        }
                    }
                }
            }
        };
        // The trigger fires on every syscall of the machine, so the kernel's
        // count may already be lower than the one written.
        let counts_ok = |k: &str, m: &str| -> bool {
            let split = |s: &str| -> Option<(String, i64, String)> {
                let i = s.find(":count=")? + 7;
                let rest = &s[i..];
                let end = rest
                    .find(|c: char| c != '-' && !c.is_ascii_digit())
                    .unwrap_or(rest.len());
                Some((
                    s[..i].to_string(),
                    rest[..end].parse().ok()?,
                    rest[end..].to_string(),
                ))
            };
            match (split(k), split(m)) {
                (Some((kp, kn, ks)), Some((mp, mn, ms))) => {
                    kp == mp && ks == ms && (kn == mn || (mn > 0 && (0..mn).contains(&kn)))
                }
                _ => k == m,
            }
        };
        let incomplete = || {
            let filter = trigger::parse(text).ok()?.filter?;
            incomplete_expression(&filter)
        };
        if k_errno == m_errno && counts_ok(&k_list, &m_list) {
            agree += 1;
        } else if let Some(why) = (k_errno == 0 && m_errno == 22).then(incomplete).flatten() {
            eprintln!("explained disagreement for {text:?}: {why}");
            agree += 1;
        } else if let Some((_, why)) = EXPLAINED.iter().find(|(t, _)| t == text) {
            eprintln!("explained disagreement for {text:?}: {why}");
            agree += 1;
        } else {
            failures.push(format!(
                "{text:?}\n  kernel: errno {k_errno}\n{k_list}  ours:   errno {m_errno}\n{m_list}"
            ));
        }
    }
    eprintln!(
        "trigger agreement: {agree}/{} ({:.1}%)",
        texts.len(),
        100.0 * agree as f64 / texts.len() as f64
    );
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// One field of a `format` file: name, C type, offset, size, signed.
type FormatField = (String, String, usize, usize, bool);

/// Fields from an event's `format` file (`field:char prev_comm[16];` becomes
/// name `prev_comm`, type `char[16]`, as the kernel stores it).
fn parse_format(text: &str) -> Vec<FormatField> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("field:")?;
            let mut parts = l.split(';').map(str::trim);
            let decl = parts.next()?;
            let num = |p: Option<&str>, key: &str| -> Option<usize> {
                p?.strip_prefix(key)?.parse().ok()
            };
            let offset = num(parts.next(), "offset:")?;
            let size = num(parts.next(), "size:")?;
            let signed = num(parts.next(), "signed:")? == 1;
            let (ty, name) = decl.rsplit_once(' ')?;
            let (name, ty) = match name.find('[') {
                Some(b) => (
                    name[..b].to_string(),
                    format!("{}{}", ty.trim(), &name[b..]),
                ),
                None => (name.to_string(), ty.trim().to_string()),
            };
            Some((name, ty, offset, size, signed))
        })
        .collect()
}

fn event_filter_cases(names: &[String], n: usize) -> Vec<String> {
    use proptest::prelude::*;
    let names = names.to_vec();
    let leaf = (
        prop::sample::select(names),
        prop::sample::select(vec!["", "", "", ".function", ".ustring"]),
        prop::sample::select(vec!["==", "!=", "<", ">=", "&", "~"]),
        prop_oneof![
            (0u32..70000).prop_map(|v| v.to_string()),
            Just("-1".to_string()),
            "[a-z*?]{0,6}".prop_map(|s| format!("\"{s}\"")),
            prop::sample::select(vec![
                "CPUS{0}",
                "CPUS{0-1}",
                "CPUS{}",
                "CPUS{5}",
                "schedule",
                "bash"
            ])
            .prop_map(String::from),
        ],
    )
        .prop_map(|(f, sfx, op, v)| format!("{f}{sfx} {op} {v}"));
    let expr = (
        leaf.clone(),
        prop::sample::select(vec![" && ", " || ", ""]),
        leaf,
    )
        .prop_map(|(a, o, b)| {
            if o.is_empty() {
                a
            } else {
                format!("{a}{o}!({b})")
            }
        });
    generated(expr, n)
}

#[test]
fn other_events_agree_with_the_kernel() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let inst = Instance::create(&format!("ustrace-difftest-ev-{}", std::process::id()))
        .expect("creating a tracefs instance");
    let syms = Kallsyms::load();
    let by_name = |n: &str| syms.function(n);
    let by_addr = |a: u64| syms.address(a);
    let env = CompileEnv {
        resolve_function: Some(&by_name),
        resolve_address: Some(&by_addr),
        nr_cpus: possible_cpus(),
    };
    let hand: &[(&str, &[&str])] = &[
        (
            "sched/sched_switch",
            &[
                "prev_comm ~ \"*sh\"",
                "prev_comm == 1",
                "prev_comm.function == schedule",
                "prev_state.function == schedule",
                "prev_pid & CPUS{0-1}",
                "next_comm ~ \"[a-z]*\" && next_pid > 0",
                "prev_comm < \"a\"",
                "prev_comm != 'x'",
            ],
        ),
        (
            "sched/sched_process_exec",
            &[
                "filename ~ \"*true\"",
                "filename == \"/bin/sh\"",
                "filename == 0",
                "filename.ustring ~ \"x*\"",
                "filename & CPUS{0}",
                "pid == -1",
            ],
        ),
        (
            "ipi/ipi_send_cpumask",
            &[
                "cpumask & CPUS{0}",
                "cpumask == CPUS{0-1}",
                "cpumask != CPUS{1}",
                "cpumask < CPUS{1}",
                "cpumask == 3",
                "cpumask ~ \"x\"",
                "callsite.function == schedule",
                "callback == 0",
            ],
        ),
        (
            "dev/devres_log",
            &[
                "op == \"add\"",
                "op.ustring ~ \"a*\"",
                "op == 1",
                "op & CPUS{0}",
                "devname ~ \"*\"",
                "dev.function == schedule",
                "size > 10",
            ],
        ),
        (
            "ext4/ext4_error",
            &[
                "function ~ \"ext4_*\"",
                "line == 3",
                "dev == 0",
                "function.function == schedule",
            ],
        ),
    ];
    let mut agree = 0usize;
    let mut total = 0usize;
    let mut failures = Vec::new();
    for (event, texts) in hand {
        let dir = inst.dir.join("events").join(event);
        let Ok(format) = fs::read_to_string(dir.join("format")) else {
            eprintln!("note: no event {event} on this kernel");
            continue;
        };
        let owned = parse_format(&format);
        let fields: Vec<ustrace_filter::Field<'_>> = owned
            .iter()
            .map(|(name, ty, offset, size, signed)| ustrace_filter::Field {
                name,
                c_type: ty,
                offset: *offset,
                size: *size,
                signed: *signed,
            })
            .collect();
        let names: Vec<String> = owned
            .iter()
            .map(|f| f.0.clone())
            .chain(["CPU".into(), "comm".into()])
            .collect();
        let mut event_texts: Vec<String> = texts.iter().map(|s| s.to_string()).collect();
        event_texts.extend(event_filter_cases(&names, cases() / 3));
        event_texts.extend(generated(mutated(event_texts.clone()), cases() / 3));
        event_texts.retain(|t| !is_clear(t));
        let filter = dir.join("filter");
        for text in &event_texts {
            total += 1;
            assert_eq!(write(&filter, "0"), 0);
            let k_errno = write(&filter, text);
            let k_file = read(&filter);
            let (m_errno, m_file) = match compile(text, &fields, &env) {
                Ok(p) => (0, format!("{}\n", p.text())),
                Err(e) => (e.errno(), e.filter_file_text(text)),
            };
            if (k_errno, &k_file) == (m_errno, &m_file) {
                agree += 1;
            } else {
                failures.push(format!("{event}: {text:?}\n  kernel: errno {k_errno}\n{k_file}  ours:   errno {m_errno}\n{m_file}"));
            }
        }
        assert_eq!(write(&filter, "0"), 0);
    }
    eprintln!("other-event filter agreement: {agree}/{total}");
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Entries of `error_log`, each without its `[timestamp] ` prefix.
fn log_entries(log: &str) -> Vec<String> {
    let mut entries: Vec<String> = Vec::new();
    for line in log.lines() {
        match line.strip_prefix('[').and_then(|l| l.split_once("] ")) {
            Some((_, first)) => entries.push(format!("{first}\n")),
            None => {
                if let Some(last) = entries.last_mut() {
                    last.push_str(line);
                    last.push('\n');
                }
            }
        }
    }
    entries
}

/// Which of `raw_syscalls`' two events recorded anything of this thread while
/// it made a few syscalls (the instance's `set_event_pid` holds only it).
fn recorded(inst: &Instance) -> (bool, bool) {
    let sys = inst.dir.join("events/raw_syscalls");
    let _ = fs::write(inst.dir.join("trace"), "");
    assert_eq!(write(&sys.join("enable"), "1"), 0);
    for _ in 0..3 {
        // SAFETY: getppid has no arguments and cannot fail.
        unsafe { libc::getppid() };
    }
    assert_eq!(write(&sys.join("enable"), "0"), 0);
    let trace = read(&inst.dir.join("trace"));
    (
        trace.contains(" sys_enter: "),
        trace.contains(" sys_exit: "),
    )
}

/// Subsystem filters: a write to `raw_syscalls/filter` is compiled for each
/// event; per event, the `filter` read-back, the `error_log` entries and what
/// is recorded must be what the crate's contract says (an event that fails
/// loses its old filter; a write of a page or more changes nothing). Single
/// event writes are checked for what they leave in force the same way.
#[test]
fn subsystem_filters_and_rejected_writes_agree_with_the_kernel() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let inst = Instance::create(&format!("ustrace-difftest-sys-{}", std::process::id()))
        .expect("creating a tracefs instance");
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    assert_eq!(write(&inst.dir.join("set_event_pid"), &tid.to_string()), 0);
    let sys = inst.dir.join("events/raw_syscalls");
    let events: Vec<(&str, Vec<FormatField>)> = ["sys_enter", "sys_exit"]
        .iter()
        .map(|e| {
            let format = read(&sys.join(e).join("format"));
            (*e, parse_format(&format))
        })
        .collect();
    let fields_of = |owned: &[FormatField]| -> Vec<ustrace_filter::Field<'static>> {
        owned
            .iter()
            .map(|(name, ty, offset, size, signed)| ustrace_filter::Field {
                name: Box::leak(name.clone().into_boxed_str()),
                c_type: Box::leak(ty.clone().into_boxed_str()),
                offset: *offset,
                size: *size,
                signed: *signed,
            })
            .collect()
    };
    let fields: Vec<Vec<ustrace_filter::Field<'static>>> =
        events.iter().map(|(_, f)| fields_of(f)).collect();
    let syms = Kallsyms::load();
    let by_name = |n: &str| syms.function(n);
    let by_addr = |a: u64| syms.address(a);
    let env = CompileEnv {
        resolve_function: Some(&by_name),
        resolve_address: Some(&by_addr),
        nr_cpus: possible_cpus(),
    };
    // A filter that keeps none of this thread's events, set before each write.
    let old = format!("common_pid == {}", tid + 1);
    let mut texts: Vec<String> = [
        "ret == 12345",
        "id == 1 && ret == 0",
        "xx == 1",
        "(id == 1",
        "id == \"x\"",
        "",
        "\n",
        " id == 1   ",
        "stacktrace == 1",
        "ret.function == schedule",
        "xx == 1\0junk",
        "ret == 5\0 && xx",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for n in [4095, 4096, 4097] {
        texts.push(padded("ret == 12345", n));
        texts.push(padded("xx == 1", n));
        texts.push(padded("0", n));
    }
    texts.extend(generated(mutated(corpus("filters.txt")), cases() / 10));
    let error_log = inst.dir.join("error_log");
    let mut failures = Vec::new();
    for text in &texts {
        for (e, _) in &events {
            assert_eq!(write(&sys.join(e).join("filter"), &old), 0);
        }
        let _ = fs::write(&error_log, "");
        let k_errno = write(&sys.join("filter"), text);
        let k_files: Vec<String> = events
            .iter()
            .map(|(e, _)| read(&sys.join(e).join("filter")))
            .collect();
        let k_log = log_entries(&read(&error_log));
        let k_rec = recorded(&inst);

        let mut m_files = Vec::new();
        let mut m_log = Vec::new();
        let mut m_rec = Vec::new();
        let m_errno = if text.len() >= ustrace_filter::MAX_WRITE {
            m_files = vec![format!("{old}\n"); events.len()];
            m_rec = vec![Some(false); events.len()];
            22
        } else if is_clear(text) {
            m_files = vec!["none\n".to_string(); events.len()];
            m_rec = vec![Some(true); events.len()];
            0
        } else {
            for f in &fields {
                match compile(text, f, &env) {
                    Ok(p) => {
                        m_files.push(format!("{}\n", p.text()));
                        // What it keeps depends on the syscalls' values: not checked.
                        m_rec.push(None);
                    }
                    Err(e) => {
                        let e = e.for_subsystem();
                        m_files.push(e.filter_file_text(text));
                        let (first, rest) = e.error_log_entry(text);
                        m_log.push(format!("{first}\n{rest}\n"));
                        // The old filter is gone: everything passes.
                        m_rec.push(Some(true));
                    }
                }
            }
            0
        };
        let k_rec = [k_rec.0, k_rec.1];
        let rec_ok = m_rec
            .iter()
            .zip(k_rec)
            .all(|(m, k)| m.is_none_or(|m| m == k));
        let agrees = (k_errno, &k_files, &k_log) == (m_errno, &m_files, &m_log) && rec_ok;
        let kernel_took = k_errno == 0 && k_log.is_empty();
        if !agrees && kernel_took && incomplete_expression(text).is_some() {
            eprintln!(
                "explained disagreement for {text:?}: {}",
                incomplete_expression(text).unwrap_or_default()
            );
        } else if !agrees {
            failures.push(format!(
                "{text:?}\n  kernel: errno {k_errno} {k_files:?} {k_log:?} recorded {k_rec:?}\n  ours:   errno {m_errno} {m_files:?} {m_log:?} recorded {m_rec:?}"
            ));
        }
    }
    // One event's own file: a rejected write leaves it unfiltered, a refused
    // one (a page or more) leaves the old filter in force.
    let enter = sys.join("sys_enter/filter");
    for (text, passes) in [
        ("xx == 1".to_string(), true),
        ("stacktrace ~ \"x\"".to_string(), true),
        ("id == 99999\0 && xx".to_string(), false),
        (padded("xx == 1", 4096), false),
        (padded("0", 4096), false),
    ] {
        assert_eq!(write(&enter, &old), 0);
        assert_eq!(write(&sys.join("sys_exit/filter"), "0"), 0);
        let _ = write(&enter, &text);
        let (k_enter, _) = recorded(&inst);
        if k_enter != passes {
            failures.push(format!(
                "sys_enter after {:?}: kernel recorded {k_enter}, contract says {passes}",
                &text[..text.len().min(40)]
            ));
        }
    }
    let _ = write(&sys.join("filter"), "0");
    let _ = write(&inst.dir.join("set_event_pid"), "");
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
