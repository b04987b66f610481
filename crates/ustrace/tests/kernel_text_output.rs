//! The text output against the real kernel: the same thread does the same things to a private
//! kernel instance and to one of ours, and the `trace` files (header and lines) and the
//! `trace_pipe` lines must read the same.
//!
//! What the kernel can be made to produce from user space, deterministically: `trace_marker`
//! writes (`tracing_mark_write:` lines), and `raw_syscalls:sys_enter` events of one system
//! call with arguments we choose (filtered to this thread), which our `raw_syscalls:sys_enter`
//! event (same fields, same print format) records from the same values. Each is compared under
//! the default options and under each output option both sides act on (`bin`, byte for byte,
//! in a test of its own), alone and with the options that change their layout.
//!
//! Before comparing, only what cannot be the same is set aside, each checked for its format
//! first: the timestamp (`%5lu.%06lu`, clocks differ; in the latency format the times since
//! the start and to the next entry), the CPU (`[%03d]`, the thread may move between the two
//! writes), the address a print record was written from (`raw`), and the preempt depth of
//! the kernel's flags (the kernel writes a marker with preemption disabled; user space has no
//! preempt count, so ours shows `.`). The comm, pid and TGID are the same thread's on both
//! sides and are compared as they are.
//!
//! Runs as root with tracefs mounted; otherwise says `skipped: <why>` and passes.

mod common;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use ustrace::FileSystem;

// The kernel's sys_enter exactly: same fields, same print format.
ustrace::trace_event! {
    pub fn raw_syscalls::sys_enter(id: isize, args: [usize; 6]) {
        id: isize = id,
        args: [usize; 6] = args,
    }
    print "NR %ld (%lx, %lx, %lx, %lx, %lx, %lx)", id, args[0], args[1], args[2], args[3], args[4], args[5];
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

/// A name for this test's instances on either side, unique among the tests that run at
/// the same time in this process.
fn instance_name(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// A private kernel instance, removed (with its event enabled and filter undone) even when
/// the test fails.
struct KernelInstance(PathBuf);

impl KernelInstance {
    fn create() -> KernelInstance {
        let dir = Path::new(TRACEFS).join(format!("instances/{}", instance_name("ustrace-text")));
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
        let name = instance_name("text-output");
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
    /// `context-info` off: the text alone (`hex` and `bin`: `type: N`, `hex` then an
    /// empty line).
    NoContext,
    /// `raw`: `pid cpu ts_ns` then `# ip text` (prints) or `type: N` (events).
    Raw,
    /// `raw` with `context-info` off: `# ip text` or `type: N` alone.
    RawNoContext,
    /// `hex`: pid, cpu and timestamp in hex, then `type: N`, then an empty line.
    Hex,
    /// `bin`: pid (4 bytes), cpu (4), timestamp (8), then `type: N`.
    Bin,
    /// `latency-format`: `%8.8s-%-7d %3d` flags, ` %4lldus` and a delay mark, `: text`.
    Latency,
    /// `latency-format` and `verbose`: `%16s %7d %3d %d %08x %08lx`, then the timestamp in
    /// microseconds as `[%08llx]`, the time since the start and to the next entry in ms.
    LatencyVerbose,
}

/// What differs by nature between the two sides' records: each side's event ids.
struct Side {
    name: &'static str,
    /// (id, event name) of the events recorded.
    ids: Vec<(u32, &'static str)>,
}

impl Side {
    /// `type: N` with N this side's id of an event, as `type: <name>`; and in a marker line,
    /// the writer's offset, size and address, which `sym-offset` and `sym-addr` add (the
    /// kernel's function that wrote it, or ours), set aside after checking their format.
    fn type_name(&self, text: &str) -> Result<String, String> {
        if let Some(rest) = text.strip_prefix("tracing_mark_write") {
            let bad = || format!("{}: marker writer in {text:?}", self.name);
            let (writer, msg) = rest.split_once(": ").ok_or_else(bad)?;
            let hex = |s: &str| s.strip_prefix("0x").is_some_and(|h| all_digits(h, 16));
            let (sym, addr) = match writer.split_once(" <") {
                Some((sym, addr)) => (sym, Some(addr)),
                None => (writer, None),
            };
            let mut out = String::from("tracing_mark_write");
            if let Some(off) = sym.strip_prefix('+') {
                let (o, size) = off.split_once('/').ok_or_else(bad)?;
                if !hex(o) || !hex(size) {
                    return Err(bad());
                }
                out.push_str("+OFF/SIZE");
            } else if !sym.is_empty() {
                return Err(bad());
            }
            if let Some(addr) = addr {
                let a = addr.strip_suffix('>').ok_or_else(bad)?;
                if a.len() != 16 || !all_digits(a, 16) {
                    return Err(bad());
                }
                out.push_str(" <ADDR>");
            }
            return Ok(format!("{out}: {msg}"));
        }
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

/// A print record's raw text, `# ip text`, with the ip (the writer's: a kernel or a user
/// address) set aside after checking that it is one.
fn raw_print(text: &str) -> Option<String> {
    let (ip, msg) = text.strip_prefix("# ")?.split_once(' ')?;
    all_digits(ip, 16).then(|| format!("# IP {msg}"))
}

/// The preempt-depth column (the kernel writes markers with preemption off) of the five
/// latency flag characters, set aside after checking it is a depth or `.`.
fn flags_column(flags: &str) -> Option<String> {
    let mut chars: Vec<char> = flags.chars().collect();
    if chars.len() != 5 || !(chars[3] == '.' || chars[3].is_ascii_hexdigit()) {
        return None;
    }
    chars[3] = '?';
    Some(chars.into_iter().collect())
}

/// One `trace` line of `layout` with what cannot match set aside (see the module comment).
fn normalise(line: &str, layout: Layout, side: &Side) -> Result<String, String> {
    let bad = |what: &str| format!("{}: {what} in {line:?}", side.name);
    match layout {
        Layout::NoContext => side.type_name(line),
        Layout::RawNoContext => match line.strip_prefix("# ") {
            Some(_) => raw_print(line).ok_or_else(|| bad("print ip")),
            None => side.type_name(line),
        },
        Layout::Latency => {
            // Fixed columns: comm (8), `-`, pid (7), ` `, cpu (3), flags (5).
            let (ctx, rest) = (line.get(..25), line.get(25..));
            let (Some(ctx), Some(rest)) = (ctx, rest) else {
                return Err(bad("short"));
            };
            let cpu = &ctx[17..20];
            if !all_digits(cpu.trim_start(), 10) {
                return Err(bad("cpu column"));
            }
            let flags = flags_column(&ctx[20..25]).ok_or_else(|| bad("flags"))?;
            // ` %4lldus` and a delay mark: the time since the buffer's start, and how long
            // until the next entry, both clock readings.
            let (time, text) = rest.split_once(": ").ok_or_else(|| bad("no time"))?;
            let t = time.strip_prefix(' ').ok_or_else(|| bad("time"))?;
            let digits = t.trim_start();
            let (us, mark) = digits.split_at(digits.len().saturating_sub(3));
            let ok = all_digits(us, 10)
                && t.len() >= 7
                && mark.len() == 3
                && mark.starts_with("us")
                && " +!#*@$".contains(&mark[2..]);
            if !ok {
                return Err(bad("time"));
            }
            Ok(format!(
                "{} CPU{flags} TIMEus?: {}",
                &ctx[..17],
                side.type_name(text)?
            ))
        }
        Layout::LatencyVerbose => {
            // Fixed columns: comm (16), ` `, pid (7), ` `, cpu (3), ` `.
            let (ctx, rest) = (line.get(..29), line.get(29..));
            let (Some(ctx), Some(rest)) = (ctx, rest) else {
                return Err(bad("short"));
            };
            if !all_digits(ctx[25..28].trim_start(), 10) {
                return Err(bad("cpu column"));
            }
            let f: Vec<&str> = rest.splitn(7, ' ').collect();
            let [flags, preempt, idx, ts, abs, rel, text] = f[..] else {
                return Err(bad("columns"));
            };
            let ms = |s: &str| {
                s.strip_suffix("ms")
                    .and_then(|s| s.split_once('.'))
                    .is_some_and(|(a, b)| all_digits(a, 10) && b.len() == 3 && all_digits(b, 10))
            };
            let ok = all_digits(flags, 10)
                && preempt.len() == 8
                && all_digits(preempt, 16)
                && idx.len() == 8
                && all_digits(idx, 16)
                && ts.len() >= 10
                && ts.starts_with('[')
                && ts.ends_with(']')
                && all_digits(&ts[1..ts.len() - 1], 16)
                && ms(abs)
                && rel
                    .strip_prefix("(+")
                    .and_then(|r| r.strip_suffix("):"))
                    .is_some_and(ms);
            if !ok {
                return Err(bad("verbose latency columns"));
            }
            // The preempt count is the kernel's (see the module comment); the time columns
            // are clock readings.
            Ok(format!(
                "{} CPU {flags} PREEMPT {idx} [TS] MS (+MS): {}",
                &ctx[..25],
                side.type_name(text)?
            ))
        }
        Layout::Default | Layout::NoIrqInfo => {
            // `%16s-%-7d [%03d] ` then, with irq-info, 5 flag characters and a space.
            let open = line.find(" [").ok_or_else(|| bad("no cpu column"))?;
            let task = &line[..open];
            let cpu = cpu_column(line.get(open + 1..open + 6).ok_or_else(|| bad("short"))?)?;
            let mut rest = line.get(open + 6..).ok_or_else(|| bad("short"))?;
            let mut flags = String::new();
            if let Layout::Default = layout {
                let f = rest.get(1..6).ok_or_else(|| bad("no flags"))?;
                let f = flags_column(f).ok_or_else(|| bad("preempt-depth column"))?;
                flags = format!(" {f}");
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
            let text = match text.strip_prefix("# ") {
                Some(_) => raw_print(text).ok_or_else(|| bad("print ip"))?,
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
    // Without the context the header is its first two lines, and `raw` records of prints
    // start with `#` too.
    let mut lines = if let Layout::RawNoContext = layout {
        2
    } else {
        usize::MAX
    };
    while bytes.get(at) == Some(&b'#') && lines > 0 {
        lines -= 1;
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

/// `bin` records: the pid kept, the cpu checked to be one and the timestamp for size only,
/// the text after.
fn bin_records(mut body: &[u8], side: &Side) -> Vec<String> {
    let mut out = Vec::new();
    while !body.is_empty() {
        assert!(body.len() > 16, "{}: short bin record {body:?}", side.name);
        let pid = i32::from_ne_bytes(body[..4].try_into().unwrap());
        let cpu = i32::from_ne_bytes(body[4..8].try_into().unwrap());
        assert!(
            (0..4096).contains(&cpu),
            "{}: bin record cpu {cpu} in {body:?}",
            side.name
        );
        let end = body[16..]
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or_else(|| panic!("{}: bin record without newline", side.name));
        let text = std::str::from_utf8(&body[16..16 + end])
            .unwrap_or_else(|e| panic!("{}: bin record text: {e}", side.name));
        out.push(format!(
            "{pid} CPU TS {}",
            side.type_name(text).unwrap_or_else(|e| panic!("{e}"))
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
        // On our side too: the tests of this file run at once, in threads of one process,
        // and our events record every thread's calls.
        both.write(
            &format!("{side}/filter"),
            &format!("common_pid == {tid} && id == {}", libc::SYS_getppid),
        );
    }
    // The kernel saves a thread's TGID (for the `record-tgid` column) only while the option
    // is on: on while recording, so that setting it for the output shows what ours shows.
    both.write("options/record-tgid", "1");
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
    sys_enter::trace(id, args);
    sys_exit::trace(id, ret as isize);
    // The kernel saves a task's comm at a context switch while events are on (until then its
    // lines say `<...>`): sleep so that this thread is switched out with them on.
    std::thread::sleep(std::time::Duration::from_millis(2));
    both.write("events/raw_syscalls/enable", "0");
    both.write("trace_marker", "after the events");
    both.write("options/record-tgid", "0");
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

/// Sets each option to its value on both sides, compares `trace` (header as it is, records
/// normalised), sets the options back; returns how many records it compared.
fn compare_trace(
    both: &Both,
    (kernel_side, our_side): (&Side, &Side),
    options: &[(&str, &str)],
    layout: Layout,
) -> usize {
    let mut before = Vec::new();
    for (option, value) in options {
        let file = format!("options/{option}");
        let v = String::from_utf8_lossy(&both.kernel.read(&file))
            .trim()
            .to_string();
        both.write(&file, value);
        before.push((file, v));
    }
    let (kh, kr) = split_trace(&both.kernel.read("trace"), layout, kernel_side);
    let (oh, or) = split_trace(&both.ours.read("trace"), layout, our_side);
    for (file, v) in before.iter().rev() {
        both.write(file, v);
    }
    assert_eq!(oh, kh, "trace header with {options:?}");
    assert_eq!(or, kr, "trace lines with {options:?}");
    assert_eq!(kr.iter().filter(|l| !l.is_empty()).count(), 5, "{kr:#?}");
    kr.len()
}

/// The `bin` layout, byte for byte but for the cpu and timestamp values: in `trace` with
/// and without `context-info`, and in `trace_pipe`.
#[test]
fn bin_output_reads_as_the_kernels() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let both = Both::new();
    let (kernel_side, our_side) = sides(&both);
    both.clear();
    record_the_same(&both);
    let sides = (&kernel_side, &our_side);
    compare_trace(&both, sides, &[("bin", "1")], Layout::Bin);
    compare_trace(
        &both,
        sides,
        &[("bin", "1"), ("context-info", "0")],
        Layout::NoContext,
    );

    both.write("options/bin", "1");
    let (kh, kr) = split_trace(&both.kernel.read_pipe(), Layout::Bin, &kernel_side);
    let (oh, or) = split_trace(&both.ours.read_pipe(), Layout::Bin, &our_side);
    both.write("options/bin", "0");
    assert!(kh.is_empty() && oh.is_empty(), "trace_pipe has no header");
    assert_eq!(or, kr, "trace_pipe records with bin");
    assert_eq!(kr.len(), 5);
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

    // (options and values, layout): the output options both sides act on. They are set
    // on both sides, compared, and set back. `bin` has a test of its own above.
    let settings: &[(&[(&str, &str)], Layout)] = &[
        (&[], Layout::Default),
        (&[("irq-info", "0")], Layout::NoIrqInfo),
        (&[("context-info", "0")], Layout::NoContext),
        (&[("raw", "1")], Layout::Raw),
        (&[("raw", "1"), ("context-info", "0")], Layout::RawNoContext),
        (&[("hex", "1")], Layout::Hex),
        (&[("hex", "1"), ("context-info", "0")], Layout::NoContext),
        // The TGID column is part of the task column here: it must match as it is.
        (&[("record-tgid", "1")], Layout::Default),
        (
            &[("record-tgid", "1"), ("irq-info", "0")],
            Layout::NoIrqInfo,
        ),
        (&[("fields", "1")], Layout::Default),
        (&[("verbose", "1")], Layout::Default),
        (&[("sym-offset", "1")], Layout::Default),
        (&[("sym-addr", "1")], Layout::Default),
        (&[("sym-offset", "1"), ("sym-addr", "1")], Layout::Default),
        (&[("latency-format", "1")], Layout::Latency),
        (
            &[("latency-format", "1"), ("verbose", "1")],
            Layout::LatencyVerbose,
        ),
    ];
    let mut compared = 0;
    for (options, layout) in settings {
        compared += compare_trace(&both, (&kernel_side, &our_side), options, *layout);
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
        "kernel text output: {} trace lines under {} settings and {} trace_pipe lines identical after normalising",
        compared,
        settings.len(),
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
    let marker = |text: &str| side.type_name(text);
    assert_eq!(
        marker("tracing_mark_write+0x8a/0x170 <ffffffff8149895a>: hi"),
        marker("tracing_mark_write+0x0/0x2f0 <000055b0484d2aa0>: hi")
    );
    for other in [
        "tracing_mark_write+0x0/0x2f0: hi",
        "tracing_mark_write <000055b0484d2aa0>: hi",
        "tracing_mark_write+0x0/0x2f0 <000055b0484d2aa0>: ho",
    ] {
        assert_ne!(
            marker("tracing_mark_write+0x8a/0x170 <ffffffff8149895a>: hi"),
            marker(other),
            "{other}"
        );
    }
    assert!(marker("tracing_mark_write+0x8g/0x170: hi").is_err());
    assert!(marker("tracing_mark_write <55b0484d2aa0>: hi").is_err());
    assert_eq!(
        normalise("# ffffffff8149895a hi", Layout::RawNoContext, &side).unwrap(),
        "# IP hi"
    );
    assert!(normalise("# ffffffff8149895z hi", Layout::RawNoContext, &side).is_err());

    // The latency format: cpu, preempt depth, time and delay mark set aside; not the rest.
    let lat = "   draft-25294     0...1.  812us+: tracing_mark_write: hi";
    let ours = "   draft-25294     1..... 1203us : tracing_mark_write: hi";
    assert_eq!(
        normalise(lat, Layout::Latency, &side),
        normalise(ours, Layout::Latency, &side)
    );
    for other in [
        "   draft-25295     1..... 1203us : tracing_mark_write: hi",
        "   draft-25294     1d.... 1203us : tracing_mark_write: hi",
        "   draft-25294     1..... 1203us : tracing_mark_write: ho",
    ] {
        assert_ne!(
            normalise(lat, Layout::Latency, &side),
            normalise(other, Layout::Latency, &side),
            "{other}"
        );
    }
    assert!(normalise(
        "   draft-25294     1..... 1203ms : x",
        Layout::Latency,
        &side
    )
    .is_err());
    assert!(normalise(
        "   draft-25294     1..... 1203usx: x",
        Layout::Latency,
        &side
    )
    .is_err());
    let verbose = "           draft   25294   0 0 00000001 00000000 [d3a415e5] 3550746.085ms (+0.016ms): tracing_mark_write: hi";
    let ours = "           draft   25294   1 0 00000000 00000000 [0001e5e5] 12.085ms (+1.000ms): tracing_mark_write: hi";
    assert_eq!(
        normalise(verbose, Layout::LatencyVerbose, &side),
        normalise(ours, Layout::LatencyVerbose, &side)
    );
    for other in [
        "           draft   25294   1 1 00000000 00000000 [0001e5e5] 12.085ms (+1.000ms): tracing_mark_write: hi",
        "           draft   25294   1 0 00000000 00000001 [0001e5e5] 12.085ms (+1.000ms): tracing_mark_write: hi",
        "           draft   25294   1 0 00000000 00000000 [0001e5e5] 12.085ms (+1.000ms): tracing_mark_write: ho",
    ] {
        assert_ne!(
            normalise(verbose, Layout::LatencyVerbose, &side),
            normalise(other, Layout::LatencyVerbose, &side),
            "{other}"
        );
    }
    assert!(normalise(
        "           draft   25294   1 0 00000000 00000000 [0001e5e5] 12.85ms (+1.000ms): x",
        Layout::LatencyVerbose,
        &side
    )
    .is_err());
}
