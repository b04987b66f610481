//! The trace options of issue 21: each one changes what ftrace.rst says it changes.
//!
//! Outputs are checked against golden files (`tests/golden/options_*.trace`), whose
//! `@NAME@` placeholders stand for what differs between runs (thread id, CPU, kernel
//! release); the `counter` clock makes timestamps exact. Where the kernel on this machine
//! can produce the same output (`trace_marker` writes), the same steps also run in a
//! private kernel instance and the two outputs are compared column by column.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use common::{body_lines, read};
use ustrace::{Errno, FileSystem, OpenFlags};

ustrace::trace_event! {
    /// One field of each kind the `fields` option prints differently.
    pub fn topt::sample(n: u32, letter: u8, big: i64, s: &str, data: &[u8], ptr: u64) {
        n: u32 = n,
        letter: u8 = letter,
        big: i64 = big,
        s: &str = s,
        data: &[u8] = data,
        comm: ustrace::FixedStr<16> = ustrace::FixedStr::new("kworker"),
        arr: [u32; 3] = [1, 2, 3],
        ptr: u64 = ptr,
    }
    print "n=%u s=%s ptr=%p", n, s, ptr;
}

/// Tests fire the same events and read the process-wide counter clock: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// An instance of ours for one test.
struct Instance(String, #[allow(dead_code)] MutexGuard<'static, ()>);

impl Instance {
    fn new(name: &str) -> Instance {
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let fs = ustrace::tracefs();
        let _ = fs.rmdir(&format!("instances/{name}"));
        fs.mkdir(&format!("instances/{name}")).expect("mkdir");
        Instance(name.to_string(), guard)
    }

    fn path(&self, p: &str) -> String {
        format!("instances/{}/{p}", self.0)
    }

    fn read(&self, p: &str) -> String {
        read(&self.path(p)).unwrap()
    }

    fn write(&self, p: &str, text: &str) -> Result<(), Errno> {
        common::write(&self.path(p), text)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.write("events/enable", "0\n");
        let _ = ustrace::tracefs().rmdir(&format!("instances/{}", self.0));
    }
}

/// A private instance of the machine's kernel tracefs, removed when dropped; `None` (the
/// test prints why) when the kernel's tracefs cannot be written.
struct KernelInstance(PathBuf);

impl KernelInstance {
    fn new(name: &str) -> Option<KernelInstance> {
        let dir = Path::new("/sys/kernel/tracing/instances").join(name);
        let _ = std::fs::remove_dir(&dir);
        match std::fs::create_dir(&dir) {
            Ok(()) => Some(KernelInstance(dir)),
            Err(e) => {
                println!("skipped: no kernel instance to compare with ({e})");
                None
            }
        }
    }

    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.0.join(file), text).unwrap_or_else(|e| panic!("{file}: {e}"));
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.0.join(file)).unwrap()
    }
}

impl Drop for KernelInstance {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Runs `f` on a thread named `name` held on one CPU; returns its thread id and CPU.
fn on_pinned_thread(name: &str, cpu: Option<usize>, f: impl FnOnce() + Send) -> (i32, usize) {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn_scoped(scope, move || {
                // SAFETY: plain syscalls on this thread with a local cpu set.
                let cpu = unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    let target = match cpu {
                        Some(cpu) => cpu,
                        None => libc::sched_getcpu().max(0) as usize,
                    };
                    libc::CPU_SET(target, &mut set);
                    assert_eq!(
                        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
                        0,
                        "pin to cpu {target}"
                    );
                    target
                };
                f();
                // SAFETY: gettid has no arguments and cannot fail.
                (unsafe { libc::gettid() }, cpu)
            })
            .unwrap()
            .join()
            .unwrap()
    })
}

/// Fills a golden file's placeholders.
fn expand(golden: &str, tid: i32, comm: &str, cpu: usize) -> String {
    let comm8: String = comm.chars().take(8).collect();
    // SAFETY: getpid has no arguments and cannot fail.
    let pid = unsafe { libc::getpid() };
    golden
        .replace("@RELEASE@", &kernel_release())
        .replace("@NRCPU@", &nr_cpus().to_string())
        .replace("@COMM8@", &format!("{comm8:>8}"))
        .replace("@COMM16@", &format!("{comm:>16}"))
        .replace("@PID-7@", &format!("{tid:<7}"))
        .replace("@PID7@", &format!("{tid:>7}"))
        .replace("@TGID7@", &format!("{pid:>7}"))
        .replace("@CPU3@", &format!("{cpu:>3}"))
        .replace("@CPU03@", &format!("{cpu:03}"))
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_string()
}

fn nr_cpus() -> usize {
    std::thread::available_parallelism().unwrap().get()
}

/// The `M:` field of a latency header, which names the kernel's preemption model: ours
/// says `unknown` when user space cannot learn it, so comparisons leave it out.
fn without_model(text: &str) -> String {
    text.lines()
        .map(|l| match (l.find("(M:"), l.find(" VP:")) {
            (Some(a), Some(b)) => format!("{}(M:*{}\n", &l[..a], &l[b..]),
            _ => format!("{l}\n"),
        })
        .collect()
}

/// Splits a latency-format line (`%8.8s-%-7d %3d` + 5 flags + ` %4lldus%c: `) into its
/// columns, checking each one's width and content; returns (cpu, text after the context).
fn latency_columns(line: &str) -> (usize, String) {
    let b = line.as_bytes();
    assert!(b.len() > 28, "short line: {line:?}");
    assert_eq!(b[8], b'-', "{line:?}");
    let pid = line[9..16].trim_end();
    assert!(pid.parse::<u32>().is_ok(), "pid column {line:?}");
    assert_eq!(b[16], b' ', "{line:?}");
    let cpu: usize = line[17..20].trim_start().parse().expect("cpu column");
    assert!(
        line[20..25]
            .chars()
            .all(|c| "dDbXnNpzZhHs.0123456789abcdef".contains(c)),
        "flag columns {line:?}"
    );
    assert_eq!(b[25], b' ', "{line:?}");
    let rest = &line[26..];
    let (stamp, text) = rest.split_once(": ").expect("timestamp ends with ': '");
    let digits = stamp
        .trim_start()
        .trim_end_matches(|c: char| "us+!#*@$ ".contains(c));
    assert!(
        digits.len() >= 4.min(stamp.len()) && digits.parse::<u64>().is_ok(),
        "timestamp {stamp:?} in {line:?}"
    );
    assert!(
        stamp.len() >= 6,
        "timestamp column is at least ' %4lld': {line:?}"
    );
    (cpu, text.to_string())
}

#[test]
fn latency_format_prints_the_latency_header_and_columns() {
    let t = Instance::new("opt_lat");
    // Before any entry the kernel prints no latency header.
    t.write("options/latency-format", "1\n").unwrap();
    assert_eq!(t.read("trace"), "# tracer: nop\n#\n");
    t.write("options/latency-format", "0\n").unwrap();
    t.write("trace_clock", "counter\n").unwrap();
    let (tid, cpu) = on_pinned_thread("opt-latency", None, || {
        for text in ["a\n", "b\n", "c\n"] {
            t.write("trace_marker", text).unwrap();
        }
    });
    // The counter moved once for each marker since the clock was set (reading `trace`
    // moves it too); the verbose form prints each entry's own count.
    let after = ustrace_ringbuf::clock::now(ustrace_ringbuf::clock::Clock::Counter);
    t.write("options/latency-format", "1\n").unwrap();
    let golden = include_str!("golden/options_latency.trace");
    let text = t.read("trace");
    assert_eq!(
        without_model(&text),
        without_model(&expand(golden, tid, "opt-latency", cpu)),
        "{text}"
    );
    t.write("options/verbose", "1\n").unwrap();
    let mut golden = expand(
        include_str!("golden/options_latency_verbose.trace"),
        tid,
        "opt-latency",
        cpu,
    );
    for i in 0..3 {
        golden = golden.replace(&format!("@TS{i}@"), &format!("{:016x}", after - 3 + i));
    }
    let text = t.read("trace");
    assert_eq!(without_model(&text), without_model(&golden), "{text}");
    // `verbose` without `latency-format` drops the column legend, as on the kernel.
    t.write("options/latency-format", "0\n").unwrap();
    assert!(t
        .read("trace")
        .starts_with("# tracer: nop\n#\n     opt-latency-"));
}

#[test]
fn latency_format_matches_the_kernels() {
    let t = Instance::new("opt_lat_k");
    let Some(k) = KernelInstance::new("ustrace_opt_lat") else {
        return;
    };
    for text in ["one\n", "two\n"] {
        t.write("trace_marker", text).unwrap();
        k.write("trace_marker", text);
    }
    t.write("options/latency-format", "1\n").unwrap();
    k.write("options/latency-format", "1");
    let ours = t.read("trace");
    let theirs = k.read("trace");
    let header = |text: &str| -> String {
        without_model(
            &text
                .lines()
                .filter(|l| l.starts_with('#'))
                .map(|l| format!("{l}\n"))
                .collect::<String>(),
        )
    };
    assert_eq!(
        header(&ours),
        header(&theirs),
        "ours:\n{ours}\nkernel:\n{theirs}"
    );
    let texts = |text: &str| -> Vec<String> {
        body_lines(text)
            .iter()
            .map(|l| latency_columns(l).1)
            .collect()
    };
    assert_eq!(texts(&ours), texts(&theirs));
    assert_eq!(
        texts(&ours),
        ["tracing_mark_write: one", "tracing_mark_write: two"]
    );
    // The long form: the same header without the legend, and the same columns.
    t.write("options/verbose", "1\n").unwrap();
    k.write("options/verbose", "1");
    let ours = t.read("trace");
    let theirs = k.read("trace");
    assert_eq!(
        header(&ours),
        header(&theirs),
        "ours:\n{ours}\nkernel:\n{theirs}"
    );
    let verbose_columns = |text: &str| -> Vec<String> {
        body_lines(text)
            .iter()
            .map(|l| {
                // %16s %7d %3d %d %08x %08lx [%08llx] %ld.%03ldms (+%ld.%03ldms): TEXT
                let (context, text) = l.split_once("ms): ").expect("verbose context");
                let words: Vec<&str> = context[16..].split_whitespace().collect();
                assert_eq!(words.len(), 8, "{l}");
                assert!(words[3].len() == 8 && words[4].len() == 8, "{l}");
                assert!(words[5].starts_with('[') && words[5].ends_with(']'), "{l}");
                assert!(
                    words[6].ends_with("ms") && words[7].starts_with("(+"),
                    "{l}"
                );
                format!("{} {text}", words[4])
            })
            .collect()
    };
    assert_eq!(verbose_columns(&ours), verbose_columns(&theirs));
    k.write("options/verbose", "0");
    k.write("options/latency-format", "0");
}

#[test]
fn record_tgid_adds_the_tgid_column_and_saved_tgids() {
    let t = Instance::new("opt_tgid");
    t.write("trace_clock", "counter\n").unwrap();
    let before = ustrace_ringbuf::clock::now(ustrace_ringbuf::clock::Clock::Counter);
    let (tid, cpu) = on_pinned_thread("opt-tgid", None, || {
        t.write("trace_marker", "hi\n").unwrap();
    });
    t.write("options/record-tgid", "1\n").unwrap();
    let golden = include_str!("golden/options_tgid.trace");
    let text = t.read("trace");
    let expected =
        expand(golden, tid, "opt-tgid", cpu).replace("@TS12@", &format!("{:>12}", before + 1));
    assert_eq!(text, expected, "{text}");
    // SAFETY: getpid has no arguments and cannot fail.
    let pid = unsafe { libc::getpid() };
    let saved = read("saved_tgids").unwrap();
    assert!(saved.contains(&format!("{tid} {pid}\n")), "{saved}");
    // Without irq-info the header loses the flag legend and keeps the TGID column.
    t.write("options/irq-info", "0\n").unwrap();
    let text = t.read("trace");
    assert!(
        text.contains(
            "#           TASK-PID       TGID    CPU#     TIMESTAMP  FUNCTION\n\
             #              | |           |       |         |         |\n"
        ),
        "{text}"
    );
    let line = body_lines(&text).pop().unwrap();
    assert_eq!(
        &line[..41],
        format!("{:>16}-{tid:<7} ({pid:>7}) [{cpu:03}] ", "opt-tgid"),
        "{line}"
    );
}

#[test]
fn record_tgid_header_matches_the_kernels() {
    let t = Instance::new("opt_tgid_k");
    let Some(k) = KernelInstance::new("ustrace_opt_tgid") else {
        return;
    };
    t.write("trace_marker", "x\n").unwrap();
    k.write("trace_marker", "x\n");
    for irq_info in ["1", "0"] {
        t.write("options/irq-info", irq_info).unwrap();
        k.write("options/irq-info", irq_info);
        t.write("options/record-tgid", "1").unwrap();
        k.write("options/record-tgid", "1");
        let header = |text: String| -> Vec<String> {
            text.lines()
                .filter(|l| l.starts_with('#') && !l.contains("entries-in-buffer"))
                .map(String::from)
                .collect()
        };
        assert_eq!(header(t.read("trace")), header(k.read("trace")));
        // The TGID column sits in the same place: `(%7d) ` or `(-------) ` after the pid.
        for text in [t.read("trace"), k.read("trace")] {
            let line = body_lines(&text).pop().unwrap();
            assert_eq!(&line[25..26], "(", "{line}");
            assert_eq!(&line[33..36], ") [", "{line}");
        }
    }
    k.write("options/record-tgid", "0");
    k.write("options/irq-info", "1");
}

#[test]
fn fields_prints_every_field_by_its_type() {
    let t = Instance::new("opt_fields");
    t.write("events/topt/sample/enable", "1\n").unwrap();
    sample::trace(7, b'A', -2, "hello", &[1, 2, 0xff], 0);
    t.write("trace_marker", "hi\n").unwrap();
    t.write("options/context-info", "0\n").unwrap();
    t.write("options/fields", "1\n").unwrap();
    assert_eq!(t.read("trace"), include_str!("golden/options_fields.trace"));
}

#[test]
fn fields_on_a_marker_prints_what_the_kernel_prints() {
    let t = Instance::new("opt_fields_k");
    let Some(k) = KernelInstance::new("ustrace_opt_fields") else {
        return;
    };
    t.write("trace_marker", "hi\n").unwrap();
    k.write("trace_marker", "hi\n");
    t.write("options/fields", "1\n").unwrap();
    k.write("options/fields", "1");
    let after_context = |text: String| -> Vec<String> {
        body_lines(&text)
            .iter()
            .map(|l| l.split_once(": ").unwrap().1.to_string())
            .collect()
    };
    assert_eq!(
        after_context(t.read("trace")),
        after_context(k.read("trace"))
    );
    k.write("options/fields", "0");
}

#[inline(never)]
fn stack_caller_inner(n: u32) {
    sample::trace(n, b'x', 0, "s", &[], 0);
    std::hint::black_box(n);
}

#[inline(never)]
fn stack_caller_outer(n: u32) {
    stack_caller_inner(n);
    std::hint::black_box(n);
}

#[test]
fn stacktrace_and_userstacktrace_follow_each_event() {
    let t = Instance::new("opt_stack");
    t.write("events/topt/sample/enable", "1\n").unwrap();
    t.write("options/context-info", "0\n").unwrap();
    stack_caller_outer(1);
    t.write("options/stacktrace", "1\n").unwrap();
    t.write("options/userstacktrace", "1\n").unwrap();
    stack_caller_outer(2);
    // A marker gets no stack, as on the kernel.
    t.write("trace_marker", "m\n").unwrap();
    t.write("options/stacktrace", "0\n").unwrap();
    t.write("options/userstacktrace", "0\n").unwrap();
    stack_caller_outer(3);
    t.write("options/sym-addr", "1\n").unwrap();
    let text = t.read("trace");
    let lines: Vec<&str> = text.lines().skip(2).collect();
    assert!(lines[0].starts_with("sample: n=1 "), "{text}");
    assert!(lines[1].starts_with("sample: n=2 "), "{text}");
    assert_eq!(lines[2], "<stack trace>", "{text}");
    let frames: Vec<&str> = lines[3..]
        .iter()
        .take_while(|l| l.starts_with(" => "))
        .copied()
        .collect();
    let names: Vec<&str> = frames
        .iter()
        .map(|f| f[4..].split(" <").next().unwrap())
        .collect();
    let inner = names.iter().position(|n| n.ends_with("stack_caller_inner"));
    let inner = inner.unwrap_or_else(|| panic!("no caller frame:\n{text}"));
    assert!(names[inner + 1].ends_with("stack_caller_outer"), "{text}");
    // The record path itself is not in the stack; the probe that recorded is.
    assert!(
        !names
            .iter()
            .any(|n| n.contains("record_checked") || n.contains("record_stacks")),
        "{text}"
    );
    // The user stack holds the first eight of the same frames, as raw addresses.
    let rest = &lines[3 + frames.len()..];
    assert_eq!(rest[0], "<user stack trace>", "{text}");
    let user: Vec<&str> = rest[1..]
        .iter()
        .take_while(|l| l.starts_with(" => "))
        .copied()
        .collect();
    assert_eq!(user.len(), frames.len().min(8), "{text}");
    for (u, k) in user.iter().zip(&frames) {
        let addr = |l: &str| {
            l.rsplit_once(" <")
                .unwrap()
                .1
                .trim_end_matches('>')
                .to_string()
        };
        assert_eq!(addr(u), addr(k), "{text}");
        assert!(u.starts_with(" =>  <"), "{u}");
    }
    let tail = &rest[1 + user.len()..];
    // With sym-addr the marker names its writer's address too, as the kernel's does.
    assert!(tail[0].starts_with("tracing_mark_write <"), "{text}");
    assert!(tail[0].ends_with(">: m"), "{text}");
    assert!(tail[1].starts_with("sample: n=3 "), "{text}");
    assert_eq!(tail.len(), 2, "{text}");
    // The kernel's layouts (copied from its format files), so libtraceevent and trace-cmd
    // read the entries as they read the kernel's.
    assert_eq!(
        read("events/ftrace/user_stack/format").unwrap(),
        include_str!("golden/options_user_stack.format")
    );
    assert_eq!(
        read("events/ftrace/kernel_stack/format").unwrap(),
        include_str!("golden/options_kernel_stack.format")
    );
}

#[test]
fn stacktrace_leaves_markers_alone_like_the_kernel() {
    let t = Instance::new("opt_stack_k");
    let Some(k) = KernelInstance::new("ustrace_opt_stack") else {
        return;
    };
    for opt in ["stacktrace", "userstacktrace"] {
        t.write(&format!("options/{opt}"), "1").unwrap();
        k.write(&format!("options/{opt}"), "1");
    }
    t.write("trace_marker", "m\n").unwrap();
    k.write("trace_marker", "m\n");
    for opt in ["stacktrace", "userstacktrace"] {
        k.write(&format!("options/{opt}"), "0");
    }
    let texts = |text: String| -> Vec<String> {
        body_lines(&text)
            .iter()
            .map(|l| l.split_once(": ").unwrap().1.to_string())
            .collect()
    };
    assert_eq!(texts(t.read("trace")), texts(k.read("trace")));
}

#[test]
fn hash_ptr_hashes_plain_pointers() {
    let t = Instance::new("opt_hash");
    t.write("events/topt/sample/enable", "1\n").unwrap();
    t.write("options/context-info", "0\n").unwrap();
    let ptr = 0x7f12_3456_789au64;
    sample::trace(1, b'a', 0, "p", &[], ptr);
    sample::trace(2, b'a', 0, "p", &[], ptr);
    sample::trace(3, b'a', 0, "null", &[], 0);
    let shown = |text: &str| -> Vec<String> {
        body_lines(text)
            .iter()
            .map(|l| l.rsplit_once("ptr=").unwrap().1.to_string())
            .collect()
    };
    let hashed = shown(&t.read("trace"));
    // 32 bits of hash in 16 digits, the same for the same pointer; NULL is not hashed.
    assert_eq!(hashed[0], hashed[1]);
    assert_eq!(hashed[0].len(), 16);
    assert!(hashed[0].starts_with("00000000"), "{hashed:?}");
    assert_ne!(hashed[0], format!("{ptr:016x}"));
    assert_eq!(hashed[2], "0000000000000000");
    t.write("options/hash-ptr", "0\n").unwrap();
    let raw = shown(&t.read("trace"));
    assert_eq!(
        raw,
        [format!("{ptr:016x}"), format!("{ptr:016x}"), "0".repeat(16)]
    );
}

/// Writes markers on `cpu` until that CPU's buffer has overwritten some.
fn overrun_cpu(write: &(dyn Fn(&str) + Sync), stats: &(dyn Fn() -> String + Sync), cpu: usize) {
    on_pinned_thread("opt-annotate", Some(cpu), || {
        for i in 0..100_000 {
            write(&format!("fill {i}\n"));
            if i % 64 == 0 && !stats().lines().any(|l| l == "overrun: 0") {
                return;
            }
        }
        panic!("no overrun");
    });
}

/// The line before the first entry of `cpu`, and whether any annotation shows.
fn before_first_of(text: &str, cpu: usize) -> (String, bool) {
    let lines: Vec<&str> = text.lines().collect();
    let first = lines
        .iter()
        .position(|l| l.contains(&format!("[{cpu:03}]")))
        .unwrap_or_else(|| panic!("no entry of cpu {cpu}:\n{text}"));
    (lines[first - 1].to_string(), text.contains("#####"))
}

#[test]
fn annotate_marks_where_a_cpu_buffer_starts_after_overwriting() {
    if nr_cpus() < 2 {
        println!("skipped: annotations need two CPUs");
        return;
    }
    let t = Instance::new("opt_annot");
    let k = KernelInstance::new("ustrace_opt_annot");
    let ours_write = |s: &str| t.write("trace_marker", s).unwrap();
    let ours_stats = || t.read("per_cpu/cpu0/stats");
    t.write("buffer_size_kb", "8\n").unwrap();
    overrun_cpu(&ours_write, &ours_stats, 0);
    on_pinned_thread("opt-annotate", Some(1), || ours_write("late\n"));
    let (before, any) = before_first_of(&t.read("trace"), 1);
    assert_eq!(before, "##### CPU 1 buffer started ####");
    assert!(any);
    t.write("options/annotate", "0\n").unwrap();
    let (before, any) = before_first_of(&t.read("trace"), 1);
    assert_ne!(before, "##### CPU 1 buffer started ####");
    assert!(!any);
    if let Some(k) = k {
        let size = k.read("buffer_size_kb");
        k.write("buffer_size_kb", "8");
        let write = |s: &str| k.write("trace_marker", s);
        let stats = || k.read("per_cpu/cpu0/stats");
        overrun_cpu(&write, &stats, 0);
        on_pinned_thread("opt-annotate", Some(1), || write("late\n"));
        let (before, _) = before_first_of(&k.read("trace"), 1);
        assert_eq!(before, "##### CPU 1 buffer started ####");
        k.write("buffer_size_kb", size.trim());
    }
}

#[test]
fn pause_on_trace_stops_recording_while_trace_is_open() {
    let t = Instance::new("opt_pause");
    let k = KernelInstance::new("ustrace_opt_pause");
    t.write("options/pause-on-trace", "1\n").unwrap();
    let reader = ustrace::tracefs()
        .open(&t.path("trace"), OpenFlags::READ)
        .unwrap();
    // Markers are refused as when tracing is off, yet tracing_on still says 1.
    assert_eq!(t.write("trace_marker", "while open\n"), Err(Errno::EBADF));
    assert_eq!(t.read("tracing_on"), "1\n");
    drop(reader);
    t.write("trace_marker", "after close\n").unwrap();
    let texts = |text: String| -> Vec<String> {
        body_lines(&text)
            .iter()
            .map(|l| l.split_once(": ").unwrap().1.to_string())
            .collect()
    };
    // Reading `trace` pauses too, so read with the option off.
    t.write("options/pause-on-trace", "0\n").unwrap();
    let ours = texts(t.read("trace"));
    assert_eq!(ours, ["tracing_mark_write: after close"]);
    // tracing_on written during a pause takes effect when it ends.
    t.write("options/pause-on-trace", "1\n").unwrap();
    let reader = ustrace::tracefs()
        .open(&t.path("trace"), OpenFlags::READ)
        .unwrap();
    t.write("tracing_on", "0\n").unwrap();
    drop(reader);
    assert_eq!(t.read("tracing_on"), "0\n");
    assert_eq!(t.write("trace_marker", "off\n"), Err(Errno::EBADF));
    if let Some(k) = k {
        k.write("options/pause-on-trace", "1");
        let reader = std::fs::File::open(k.0.join("trace")).unwrap();
        let refused = std::fs::write(k.0.join("trace_marker"), "while open\n").unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EBADF));
        assert_eq!(k.read("tracing_on"), "1\n");
        drop(reader);
        k.write("trace_marker", "after close\n");
        k.write("options/pause-on-trace", "0");
        assert_eq!(texts(k.read("trace")), ours);
    }
}

#[test]
fn options_without_a_meaning_here_are_absent() {
    let t = Instance::new("opt_absent");
    // `block` only; `print-parent` shapes the function tracer's lines (tests/ftrace_tracers.rs).
    {
        let name = "block";
        assert_eq!(
            ustrace::tracefs()
                .stat(&t.path(&format!("options/{name}")))
                .err(),
            Some(Errno::ENOENT)
        );
        assert_eq!(t.write("trace_options", name), Err(Errno::EINVAL));
        assert!(!t.read("trace_options").contains(name));
    }
    let listed: Vec<String> = ustrace::tracefs()
        .readdir(&t.path("options"))
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    // The 21 general options, the function tracers' 9 and the profiler's `graph-time`.
    assert_eq!(listed.len(), 31, "{listed:?}");
}

/// Reads pages with libtraceevent: the stack entries' format files (ours) are parsed and
/// each entry's fields come back as written.
const TEP_HARNESS: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <traceevent/event-parse.h>
#include <traceevent/kbuffer.h>

static char *slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END); *len = ftell(f); fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len + 1);
    if (fread(buf, 1, *len, f) != (size_t)*len) { perror("read"); exit(2); }
    buf[*len] = 0; fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    long len, plen;
    struct tep_handle *tep = tep_alloc();
    tep_set_long_size(tep, 8);
    tep_set_page_size(tep, 4096);
    char *hdr = slurp(argv[1], &len);
    if (tep_parse_header_page(tep, hdr, len, 8)) { fprintf(stderr, "header_page\n"); return 3; }
    for (int i = 2; i <= 3; i++) {
        char *fmt = slurp(argv[i], &len);
        if (tep_parse_event(tep, fmt, len, "ftrace")) { fprintf(stderr, "format %s\n", argv[i]); return 3; }
    }
    char *pages = slurp(argv[4], &plen);
    struct kbuffer *kbuf = kbuffer_alloc(KBUFFER_LSIZE_8, KBUFFER_ENDIAN_LITTLE);
    for (long off = 0; off + 4096 <= plen; off += 4096) {
        if (kbuffer_load_subbuffer(kbuf, pages + off)) { fprintf(stderr, "page\n"); return 3; }
        unsigned long long ts;
        for (void *data = kbuffer_read_event(kbuf, &ts); data; data = kbuffer_next_event(kbuf, NULL)) {
            struct tep_record rec;
            memset(&rec, 0, sizeof rec);
            rec.ts = ts; rec.data = data; rec.size = kbuffer_event_size(kbuf);
            struct tep_event *ev = tep_find_event(tep, tep_data_type(tep, &rec));
            if (!ev) continue;
            unsigned long long head = 0;
            int flen;
            tep_get_field_val(NULL, ev, strcmp(ev->name, "user_stack") ? "size" : "tgid", &rec, &head, 1);
            unsigned long long *caller = tep_get_field_raw(NULL, ev, "caller", &rec, &flen, 1);
            printf("%s %llu", ev->name, head);
            for (int i = 0; caller && i < 8 && caller[i]; i++)
                printf(" %llx", caller[i]);
            printf("\n");
        }
    }
    return 0;
}
"#;

#[test]
fn libtraceevent_reads_the_stack_entries() {
    if !Path::new("/usr/include/traceevent/event-parse.h").exists() {
        println!("skipped: libtraceevent headers missing (libtraceevent-dev)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("ustrace-opt-tep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("h.c"), TEP_HARNESS).unwrap();
    let built = std::process::Command::new("cc")
        .args(["-O1", "-o"])
        .arg(dir.join("h"))
        .arg(dir.join("h.c"))
        .arg("-ltraceevent")
        .output();
    let Ok(built) = built else {
        println!("skipped: no C compiler");
        return;
    };
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    for (name, file) in [
        ("header_page", "events/header_page"),
        ("kernel_stack", "events/ftrace/kernel_stack/format"),
        ("user_stack", "events/ftrace/user_stack/format"),
    ] {
        std::fs::write(dir.join(name), read(file).unwrap()).unwrap();
    }
    let t = Instance::new("opt_tep");
    t.write("events/topt/sample/enable", "1\n").unwrap();
    t.write("options/stacktrace", "1\n").unwrap();
    t.write("options/userstacktrace", "1\n").unwrap();
    let (_, cpu) = on_pinned_thread("opt-tep", None, || stack_caller_outer(9));
    t.write("options/stacktrace", "0\n").unwrap();
    t.write("options/userstacktrace", "0\n").unwrap();
    t.write("options/sym-addr", "1\n").unwrap();
    t.write("options/context-info", "0\n").unwrap();
    // What our own reader shows, before the raw reader consumes the pages.
    let text = t.read("trace");
    let addrs = |header: &str| -> Vec<String> {
        text.split(header)
            .nth(1)
            .unwrap()
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with(" => "))
            .map(|l| {
                l.rsplit_once('<')
                    .unwrap()
                    .1
                    .trim_end_matches('>')
                    .trim_start_matches('0')
                    .to_string()
            })
            .collect()
    };
    let (kernel, user) = (addrs("<stack trace>"), addrs("<user stack trace>"));
    let mut pages = Vec::new();
    let mut pipe = ustrace::tracefs()
        .open(
            &t.path(&format!("per_cpu/cpu{cpu}/trace_pipe_raw")),
            OpenFlags::READ,
        )
        .unwrap();
    let mut page = vec![0u8; 4096];
    while let Ok(n) = pipe.read(&mut page, Some(std::time::Duration::from_millis(50))) {
        if n == 0 {
            break;
        }
        pages.extend_from_slice(&page[..n]);
    }
    std::fs::write(dir.join("pages"), &pages).unwrap();
    let out = std::process::Command::new(dir.join("h"))
        .args(["header_page", "kernel_stack", "user_stack", "pages"].map(|f| dir.join(f)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8(out.stdout).unwrap();
    // SAFETY: getpid has no arguments and cannot fail.
    let pid = unsafe { libc::getpid() };
    let expected_kernel = format!(
        "kernel_stack {} {}",
        kernel.len(),
        kernel[..kernel.len().min(8)].join(" ")
    );
    let expected_user = format!("user_stack {pid} {}", user.join(" "));
    assert_eq!(lines, format!("{expected_kernel}\n{expected_user}\n"));
    let _ = std::fs::remove_dir_all(&dir);
}
