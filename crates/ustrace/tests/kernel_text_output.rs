//! The text output against the real kernel: the same thread does the same things to a private
//! kernel instance and to one of ours, and the `trace` files (header and lines) and the
//! `trace_pipe` lines must read the same.
//!
//! What the kernel can be made to produce from user space, deterministically: `trace_marker`
//! writes (`tracing_mark_write:` lines), and `raw_syscalls:sys_enter` events of one system
//! call with arguments we choose (filtered to this thread), which our `raw_syscalls:sys_enter`
//! event (same fields, same print format) records from the same values. Each is compared under
//! the default options and under each output option both sides act on.
//!
//! Before comparing, only what cannot be the same is set aside, each checked for its format
//! first: the timestamp (`%5lu.%06lu`, clocks differ), the CPU (`[%03d]`, the thread may move
//! between the two writes), and the preempt-depth column of the kernel's flags (the kernel
//! writes a marker with preemption disabled; user space has no preempt count, so ours shows
//! `.`). The comm and pid are the same thread's on both sides and are compared as they are.
//!
//! Runs as root with tracefs mounted; otherwise says `skipped: <why>` and passes.

mod common;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use ustrace::FileSystem;

// The kernel's sys_enter prints `REC->args[0]` .. `REC->args[5]`; our print formats name
// whole fields, so the six arguments are six fields here. The printed text is the kernel's.
ustrace::trace_event! {
    pub fn raw_syscalls::sys_enter(id: isize, a0: usize, a1: usize, a2: usize, a3: usize, a4: usize, a5: usize) {
        id: isize = id,
        a0: usize = a0,
        a1: usize = a1,
        a2: usize = a2,
        a3: usize = a3,
        a4: usize = a4,
        a5: usize = a5,
    }
    print "NR %ld (%lx, %lx, %lx, %lx, %lx, %lx)", id, a0, a1, a2, a3, a4, a5;
}

// The kernel's sys_exit exactly: same fields, same print format.
ustrace::trace_event! {
    pub fn raw_syscalls::sys_exit(id: isize, ret: isize) {
        id: isize = id,
        ret: isize = ret,
    }
    print "NR %ld = %ld", id, ret;
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

/// A private kernel instance, removed (with its event enabled and filter undone) even when
/// the test fails.
struct KernelInstance(PathBuf);

impl KernelInstance {
    fn create() -> KernelInstance {
        let dir = Path::new(TRACEFS).join(format!("instances/ustrace-text-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).expect("mkdir kernel instance");
        KernelInstance(dir)
    }
    /// One write(2) of `text`, as `echo -n` does.
    fn write(&self, p: &str, text: &str) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(self.0.join(p))
            .unwrap_or_else(|e| panic!("open kernel {p}: {e}"));
        // SAFETY: writes from a live buffer of the given length to an open descriptor.
        let n = unsafe { libc::write(f.as_raw_fd(), text.as_ptr().cast(), text.len()) };
        assert_eq!(
            n,
            text.len() as isize,
            "kernel {p} <- {text:?}: {}",
            std::io::Error::last_os_error()
        );
    }
    fn read(&self, p: &str) -> Vec<u8> {
        std::fs::read(self.0.join(p)).unwrap_or_else(|e| panic!("read kernel {p}: {e}"))
    }
    /// What `trace_pipe` has now, without waiting for more.
    fn read_pipe(&self) -> Vec<u8> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(self.0.join("trace_pipe"))
            .expect("open kernel trace_pipe");
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
                Err(e) => panic!("read kernel trace_pipe: {e}"),
            }
        }
        out
    }
}

impl Drop for KernelInstance {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("events/raw_syscalls/sys_enter/enable"), "0");
        let _ = std::fs::write(self.0.join("events/raw_syscalls/sys_enter/filter"), "0");
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Our instance of the same name shape, removed on drop.
struct Ours(String);

impl Ours {
    fn create() -> Ours {
        let name = format!("text-output-{}", std::process::id());
        let _ = ustrace::tracefs().rmdir(&format!("instances/{name}"));
        ustrace::tracefs()
            .mkdir(&format!("instances/{name}"))
            .expect("mkdir our instance");
        Ours(name)
    }
    fn path(&self, p: &str) -> String {
        format!("instances/{}/{p}", self.0)
    }
    fn write(&self, p: &str, text: &str) {
        common::write(&self.path(p), text).unwrap_or_else(|e| panic!("our {p} <- {text:?}: {e}"));
    }
    fn read(&self, p: &str) -> Vec<u8> {
        let mut f = ustrace::tracefs()
            .open(&self.path(p), ustrace::OpenFlags::READ)
            .unwrap_or_else(|e| panic!("open our {p}: {e}"));
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match f.read(&mut buf, None) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) => panic!("read our {p}: {e}"),
            }
        }
    }
    fn read_pipe(&self) -> Vec<u8> {
        let flags = ustrace::OpenFlags {
            nonblock: true,
            ..ustrace::OpenFlags::READ
        };
        let mut f = ustrace::tracefs()
            .open(&self.path("trace_pipe"), flags)
            .expect("open our trace_pipe");
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match f.read(&mut buf, None) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e == ustrace::Errno::EAGAIN => break,
                Err(e) => panic!("read our trace_pipe: {e}"),
            }
        }
        out
    }
}

impl Drop for Ours {
    fn drop(&mut self) {
        let _ = ustrace::tracefs().rmdir(&format!("instances/{}", self.0));
    }
}

fn gettid() -> i64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

/// Both sides after the same steps.
struct Both {
    kernel: KernelInstance,
    ours: Ours,
}

impl Both {
    fn new() -> Both {
        Both {
            kernel: KernelInstance::create(),
            ours: Ours::create(),
        }
    }
    fn write(&self, p: &str, text: &str) {
        self.kernel.write(p, text);
        self.ours.write(p, text);
    }
    fn clear(&self) {
        self.write("trace", "");
    }
}

/// How a trace is printed: which option is set, and so which line layout to expect.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// `TASK-PID [CPU] flags TIMESTAMP: text`, the default.
    Default,
    /// `irq-info` off: no flags column.
    NoIrqInfo,
    /// `context-info` off: the text alone.
    NoContext,
    /// `raw`: `pid cpu ts_ns` then `# ip text` (prints) or `type: N` (events).
    Raw,
    /// `hex`: pid, cpu and timestamp in hex, then `type: N`, then an empty line.
    Hex,
    /// `bin`: pid (4 bytes), cpu (4), timestamp (8), then `type: N`.
    Bin,
}

/// What differs by nature between the two sides' records: each side's event ids.
struct Side {
    name: &'static str,
    /// (id, event name) of the events recorded.
    ids: Vec<(u32, &'static str)>,
}

impl Side {
    /// `type: N` with N this side's id of an event, as `type: <name>`.
    fn type_name(&self, text: &str) -> Result<String, String> {
        let Some(n) = text.strip_prefix("type: ") else {
            return Ok(text.to_string());
        };
        let n: u32 = n.parse().map_err(|_| format!("type id {n:?}"))?;
        // TRACE_PRINT, the marker record, has the same number on both sides.
        if n == 5 {
            return Ok("type: 5 (print)".into());
        }
        let (_, name) = self
            .ids
            .iter()
            .find(|(id, _)| *id == n)
            .ok_or_else(|| format!("{}: type {n} is none of its events' ids", self.name))?;
        Ok(format!("type: <{name}>"))
    }
}

fn all_digits(s: &str, radix: u32) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_digit(radix))
}

/// `[ddd]` -> `[CPU]`, after checking the format.
fn cpu_column(s: &str) -> Result<&str, String> {
    let inner = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .ok_or_else(|| format!("cpu column {s:?}"))?;
    if inner.len() == 3 && all_digits(inner, 10) {
        Ok("[CPU]")
    } else {
        Err(format!("cpu column {s:?}"))
    }
}

/// `%5lu.%06lu` (its leading spaces included) with every digit made `9`, after checking.
fn timestamp_column(s: &str) -> Result<String, String> {
    let t = s.trim_start();
    match t.split_once('.') {
        Some((secs, usecs))
            if all_digits(secs, 10) && usecs.len() == 6 && all_digits(usecs, 10) =>
        {
            Ok(s.chars()
                .map(|c| if c.is_ascii_digit() { '9' } else { c })
                .collect())
        }
        _ => Err(format!("timestamp {s:?}")),
    }
}

/// One `trace` line of `layout` with what cannot match set aside (see the module comment).
fn normalise(line: &str, layout: Layout, side: &Side) -> Result<String, String> {
    let bad = |what: &str| format!("{}: {what} in {line:?}", side.name);
    match layout {
        Layout::NoContext => side.type_name(line),
        Layout::Default | Layout::NoIrqInfo => {
            // `%16s-%-7d [%03d] ` then, with irq-info, 5 flag characters and a space.
            let open = line.find(" [").ok_or_else(|| bad("no cpu column"))?;
            let task = &line[..open];
            let cpu = cpu_column(line.get(open + 1..open + 6).ok_or_else(|| bad("short"))?)?;
            let mut rest = line.get(open + 6..).ok_or_else(|| bad("short"))?;
            let mut flags = String::new();
            if let Layout::Default = layout {
                let f = rest.get(1..6).ok_or_else(|| bad("no flags"))?;
                let mut chars: Vec<char> = f.chars().collect();
                // The preempt-depth column: the kernel writes markers with preemption off.
                if !(chars[3] == '.' || chars[3].is_ascii_hexdigit()) {
                    return Err(bad("preempt-depth column"));
                }
                chars[3] = '?';
                flags = format!(" {}", chars.into_iter().collect::<String>());
                rest = &rest[6..];
            }
            let colon = rest.find(": ").ok_or_else(|| bad("no timestamp"))?;
            let ts = timestamp_column(&rest[..colon])?;
            let text = side.type_name(&rest[colon + 2..])?;
            Ok(format!("{task} {cpu}{flags}{ts}: {text}"))
        }
        Layout::Raw => {
            let mut f = line.splitn(4, ' ');
            let (pid, cpu, ts, text) = (
                f.next().unwrap_or(""),
                f.next().unwrap_or(""),
                f.next().unwrap_or(""),
                f.next().unwrap_or(""),
            );
            if !all_digits(pid, 10) || !all_digits(cpu, 10) || !all_digits(ts, 10) {
                return Err(bad("pid cpu ts"));
            }
            // A print record: `# ip text`, the ip the writer's (a kernel or a user address).
            let text = match text.strip_prefix("# ") {
                Some(r) => {
                    let (ip, msg) = r.split_once(' ').ok_or_else(|| bad("print ip"))?;
                    if !all_digits(ip, 16) {
                        return Err(bad("print ip"));
                    }
                    format!("# IP {msg}")
                }
                None => side.type_name(text)?,
            };
            Ok(format!("{pid} CPU TS {text}"))
        }
        Layout::Hex => {
            if line.is_empty() {
                return Ok(String::new());
            }
            let mut f = line.splitn(4, ' ');
            let (pid, cpu, ts, text) = (
                f.next().unwrap_or(""),
                f.next().unwrap_or(""),
                f.next().unwrap_or(""),
                f.next().unwrap_or(""),
            );
            let hex = |s: &str, n: usize| s.len() == n && all_digits(s, 16);
            if !hex(pid, 8) || !hex(cpu, 8) || !hex(ts, 16) {
                return Err(bad("hex pid cpu ts"));
            }
            Ok(format!("{pid} CPU TS {}", side.type_name(text)?))
        }
        Layout::Bin => unreachable!("binary records are split by bin_records"),
    }
}

/// A `trace` file split into its header (the `#` lines, compared as they are) and its
/// normalised records.
fn split_trace(bytes: &[u8], layout: Layout, side: &Side) -> (String, Vec<String>) {
    let mut header = String::new();
    let mut at = 0;
    while bytes.get(at) == Some(&b'#') {
        let end = bytes[at..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(bytes.len(), |e| at + e + 1);
        header.push_str(&String::from_utf8_lossy(&bytes[at..end]));
        at = end;
    }
    let body = &bytes[at..];
    let records = match layout {
        Layout::Bin => bin_records(body, side),
        _ => String::from_utf8(body.to_vec())
            .unwrap_or_else(|e| panic!("{}: trace is not text: {e}", side.name))
            .lines()
            .map(|l| normalise(l, layout, side).unwrap_or_else(|e| panic!("{e}")))
            .collect(),
    };
    (header, records)
}

/// `bin` records: the pid kept, cpu and timestamp checked for size only, the text after.
fn bin_records(mut body: &[u8], side: &Side) -> Vec<String> {
    let mut out = Vec::new();
    while !body.is_empty() {
        assert!(body.len() > 16, "{}: short bin record {body:?}", side.name);
        let pid = u32::from_ne_bytes(body[..4].try_into().unwrap());
        let end = body[16..]
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or_else(|| panic!("{}: bin record without newline", side.name));
        let text = String::from_utf8_lossy(&body[16..16 + end]).into_owned();
        out.push(format!(
            "{pid} CPU TS {}",
            side.type_name(&text).unwrap_or_else(|e| panic!("{e}"))
        ));
        body = &body[16 + end + 1..];
    }
    out
}

/// The same thread writes the same markers and makes the same system call (whose sys_enter
/// and sys_exit the kernel records, filtered to this thread) that our events record.
fn record_the_same(both: &Both) {
    let tid = gettid();
    for side in [
        "events/raw_syscalls/sys_enter",
        "events/raw_syscalls/sys_exit",
    ] {
        both.kernel.write(
            &format!("{side}/filter"),
            &format!("common_pid == {tid} && id == {}", libc::SYS_getppid),
        );
    }
    both.write("trace_marker", "hello from the same thread\n");
    both.write("trace_marker", "no newline, 42 % 7 \\n");
    both.write("events/raw_syscalls/enable", "1");
    let args: [usize; 6] = [1, 0x22, 0x333, 4, 0xdead_beef, usize::MAX];
    // SAFETY: getppid ignores its arguments; sys_enter records them from the six argument
    // registers.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_getppid,
            args[0],
            args[1],
            args[2],
            args[3],
            args[4],
            args[5],
        )
    };
    let id = libc::SYS_getppid as isize;
    sys_enter::trace(id, args[0], args[1], args[2], args[3], args[4], args[5]);
    sys_exit::trace(id, ret as isize);
    // The kernel saves a task's comm at a context switch while events are on (until then its
    // lines say `<...>`): sleep so that this thread is switched out with them on.
    std::thread::sleep(std::time::Duration::from_millis(2));
    both.write("events/raw_syscalls/enable", "0");
    both.write("trace_marker", "after the events");
}

fn sides(both: &Both) -> (Side, Side) {
    let ids = |read: &dyn Fn(&str) -> Vec<u8>| {
        ["sys_enter", "sys_exit"]
            .map(|e| {
                let text = read(&format!("events/raw_syscalls/{e}/id"));
                let id = String::from_utf8_lossy(&text)
                    .trim()
                    .parse()
                    .expect("event id");
                (id, e)
            })
            .to_vec()
    };
    (
        Side {
            name: "kernel",
            ids: ids(&|p| both.kernel.read(p)),
        },
        Side {
            name: "ours",
            ids: ids(&|p| both.ours.read(p)),
        },
    )
}

/// Sets `option` to `value` on both sides (none when empty), compares `trace` (header as it
/// is, records normalised), sets the option back; returns how many records it compared.
fn compare_trace(
    both: &Both,
    (kernel_side, our_side): (&Side, &Side),
    option: &str,
    value: &str,
    layout: Layout,
) -> usize {
    let file = format!("options/{option}");
    let before = (!option.is_empty()).then(|| {
        let v = String::from_utf8_lossy(&both.kernel.read(&file))
            .trim()
            .to_string();
        both.write(&file, value);
        v
    });
    let (kh, kr) = split_trace(&both.kernel.read("trace"), layout, kernel_side);
    let (oh, or) = split_trace(&both.ours.read("trace"), layout, our_side);
    if let Some(v) = before {
        both.write(&file, &v);
    }
    assert_eq!(oh, kh, "trace header with {option}={value}");
    assert_eq!(or, kr, "trace lines with {option}={value}");
    assert_eq!(kr.iter().filter(|l| !l.is_empty()).count(), 5, "{kr:#?}");
    kr.len()
}

/// The `bin` layout. It differs today: our trace is text, so the binary pid, cpu and
/// timestamp go through a lossy UTF-8 conversion, and no `type: N` line follows them.
#[test]
#[ignore = "known difference: our `bin` output (lossy binary fields, no `type: N`); run with --ignored"]
fn bin_output_reads_as_the_kernels() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let both = Both::new();
    let (kernel_side, our_side) = sides(&both);
    both.clear();
    record_the_same(&both);
    compare_trace(&both, (&kernel_side, &our_side), "bin", "1", Layout::Bin);
}

#[test]
fn trace_and_trace_pipe_read_as_the_kernels() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let both = Both::new();
    let (kernel_side, our_side) = sides(&both);
    both.clear();
    record_the_same(&both);

    // (option, value, layout): the output options both sides act on. Each is set on both
    // sides, compared, and set back. `bin` has a test of its own below.
    let settings: [(&str, &str, Layout); 5] = [
        ("", "", Layout::Default),
        ("irq-info", "0", Layout::NoIrqInfo),
        ("context-info", "0", Layout::NoContext),
        ("raw", "1", Layout::Raw),
        ("hex", "1", Layout::Hex),
    ];
    let mut compared = 0;
    for (option, value, layout) in settings {
        compared += compare_trace(&both, (&kernel_side, &our_side), option, value, layout);
    }

    // trace_pipe: the same lines, no header, consumed.
    let kp = both.kernel.read_pipe();
    let op = both.ours.read_pipe();
    let (kh, kr) = split_trace(&kp, Layout::Default, &kernel_side);
    let (oh, or) = split_trace(&op, Layout::Default, &our_side);
    assert!(kh.is_empty() && oh.is_empty(), "trace_pipe has no header");
    assert_eq!(or, kr, "trace_pipe lines");
    assert_eq!(kr.len(), 5);
    assert!(both.kernel.read_pipe().is_empty() && both.ours.read_pipe().is_empty());
    eprintln!(
        "kernel text output: {} trace lines under 5 settings and {} trace_pipe lines identical after normalising",
        compared,
        kr.len()
    );
}

/// The normalising above sets aside only the columns it names, each after checking its
/// format: anything else that differs still fails.
#[test]
fn normalising_keeps_what_must_match() {
    let side = Side {
        name: "t",
        ids: vec![(443, "sys_enter")],
    };
    let line = "           draft-25294   [001] ...1.  1792.449560: tracing_mark_write: hi";
    let ours = "           draft-25294   [000] .....  1792.501587: tracing_mark_write: hi";
    assert_eq!(
        normalise(line, Layout::Default, &side),
        normalise(ours, Layout::Default, &side)
    );
    for other in [
        "           draft-25295   [000] .....  1792.501587: tracing_mark_write: hi",
        "           draft-25294   [000] ..... 1792.501587: tracing_mark_write: hi",
        "           draft-25294   [000] X....  1792.501587: tracing_mark_write: hi",
        "           draft-25294   [000] .....  1792.501587: tracing_mark_write: ho",
        "           drafts-25294  [000] .....  1792.501587: tracing_mark_write: hi",
    ] {
        assert_ne!(
            normalise(line, Layout::Default, &side),
            normalise(other, Layout::Default, &side),
            "{other}"
        );
    }
    assert!(normalise("x-1 [01] ..... 1.000001: a", Layout::Default, &side).is_err());
    assert!(normalise("x-1 [001] ..... 1.00001: a", Layout::Default, &side).is_err());
    assert_eq!(
        normalise("25294 1 1792461437123 type: 443", Layout::Raw, &side).unwrap(),
        "25294 CPU TS type: <sys_enter>"
    );
    assert!(normalise("25294 1 1792461437123 type: 444", Layout::Raw, &side).is_err());
}
