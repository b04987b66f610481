//! The tracefs tree driven as a shell user drives `/sys/kernel/tracing`.
//!
//! Every test works in an instance of its own (`instances/NAME`), as independent as the
//! kernel's, so tests can run in parallel in one process.

mod common;
#[path = "common/cpus.rs"]
mod cpus;

use std::time::Duration;

use common::{body_lines, read};
use ustrace::{Errno, FileSystem, OpenFlags};

ustrace::trace_event! {
    pub fn tsched::sched_wakeup(comm: &str, pid: i32, prio: i32, target_cpu: i32) {
        comm: &str = comm,
        pid: i32 = pid,
        prio: i32 = prio,
        target_cpu: i32 = target_cpu,
    }
    print "comm=%s pid=%d prio=%d target_cpu=%03d", comm, pid, prio, target_cpu;
}

ustrace::trace_event! {
    pub fn tsched::sched_switch(prev_pid: i32, next_pid: i32) {
        prev_pid: i32 = prev_pid,
        next_pid: i32 = next_pid,
    }
    print "prev_pid=%d ==> next_pid=%d", prev_pid, next_pid;
}

ustrace::trace_event! {
    pub fn tirq::irq_handler_entry(irq: i32, name: &str) {
        irq: i32 = irq,
        name: &str = name,
    }
    print "irq=%d name=%s", irq, name;
}

ustrace::trace_event! {
    pub fn tirq::softirq_entry(vec: u32) {
        vec: u32 = vec,
    }
    print "vec=%u", vec;
}

ustrace::trace_event! {
    /// Every field kind, for the format golden test.
    pub fn tformat::all_kinds(a: u8, b: i64, s: &str, data: &[u8], comm: &str, arr: [u32; 3], ul: usize) {
        a: u8 = a,
        b: i64 = b,
        s: &str = s,
        data: &[u8] = data,
        comm: ustrace::FixedStr<16> = ustrace::FixedStr::new(comm),
        arr: [u32; 3] = arr,
        ul: usize = ul,
        flag: bool = a > 1,
    }
    print "a=%u b=%lld s=%s data=%s comm=%s arr=%s ul=%lu flag=%d", a, b, s, data, comm, arr, ul, flag;
}

/// An instance for one test. Tests fire the same tracepoints, which would record into each
/// other's instances if they ran at once, so holding one also holds the test lock.
struct Instance(
    String,
    #[allow(dead_code)] std::sync::MutexGuard<'static, ()>,
);

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// For a second instance inside a test that already holds `SERIAL`.
static SERIAL_FREE: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Instance {
    fn new(name: &str) -> Instance {
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let fs = ustrace::tracefs();
        let _ = fs.rmdir(&format!("instances/{name}"));
        fs.mkdir(&format!("instances/{name}"))
            .expect("mkdir instance");
        Instance(name.to_string(), guard)
    }

    fn path(&self, p: &str) -> String {
        format!("instances/{}/{p}", self.0)
    }

    fn read(&self, p: &str) -> String {
        read(&self.path(p)).unwrap()
    }

    fn write(&self, p: &str, text: &str) -> Result<(), Errno> {
        write(&self.path(p), text, false)
    }

    fn append(&self, p: &str, text: &str) -> Result<(), Errno> {
        write(&self.path(p), text, true)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.write("events/enable", "0\n");
        let _ = ustrace::tracefs().rmdir(&format!("instances/{}", self.0));
    }
}

fn write(path: &str, text: &str, append: bool) -> Result<(), Errno> {
    if append {
        common::append(path, text)
    } else {
        common::write(path, text)
    }
}

fn fire_all() {
    sched_wakeup::trace("kworker", 42, 120, 1);
    sched_switch::trace(1, 42);
    irq_handler_entry::trace(19, "eth0");
    softirq_entry::trace(3);
}

// See: events.rst 2.1, "Via the 'set_event' interface".
#[test]
fn set_event_examples_of_events_rst_2_1() {
    let t = Instance::new("set-event");
    // echo sched_wakeup >> set_event
    t.append("set_event", "sched_wakeup\n").unwrap();
    assert_eq!(t.read("set_event"), "tsched:sched_wakeup\n");
    // echo '!sched_wakeup' >> set_event
    t.append("set_event", "!sched_wakeup\n").unwrap();
    assert_eq!(t.read("set_event"), "");
    // echo *:* > set_event, and *:
    t.write("set_event", "*:*\n").unwrap();
    let all = t.read("set_event");
    assert!(all.contains("tsched:sched_switch\n") && all.contains("tirq:softirq_entry\n"));
    assert!(!all.contains("ftrace:"), "ftrace events cannot be enabled");
    // echo > set_event disables everything.
    t.write("set_event", "\n").unwrap();
    assert_eq!(t.read("set_event"), "");
    t.write("set_event", "*:\n").unwrap();
    assert_eq!(t.read("set_event"), all);
    // echo 'irq:*' > set_event: the truncating write first disables everything.
    t.write("set_event", "tirq:*\n").unwrap();
    assert_eq!(
        t.read("set_event"),
        "tirq:irq_handler_entry\ntirq:softirq_entry\n"
    );
    // A system name alone, `SYS:`, and `:EVENT` select as the kernel's parser does.
    t.write("set_event", "tsched\n").unwrap();
    assert_eq!(
        t.read("set_event"),
        "tsched:sched_switch\ntsched:sched_wakeup\n"
    );
    t.write("set_event", "tirq:\n").unwrap();
    assert_eq!(
        t.read("set_event"),
        "tirq:irq_handler_entry\ntirq:softirq_entry\n"
    );
    t.write("set_event", ":sched_switch\n").unwrap();
    assert_eq!(t.read("set_event"), "tsched:sched_switch\n");
    // Several words in one write.
    t.write("set_event", "sched_switch softirq_entry\n")
        .unwrap();
    // Listed in event-id order, which is (system, name) order.
    assert_eq!(
        t.read("set_event"),
        "tirq:softirq_entry\ntsched:sched_switch\n"
    );
}

#[test]
fn set_event_rejects_unknown_events_without_applying_anything() {
    let t = Instance::new("set-event-bad");
    for bad in [
        "nosuch\n",
        "tsched:nosuch\n",
        "*\n",
        "ftrace:print\n",
        "tirq:* nosuch\n",
    ] {
        assert_eq!(t.append("set_event", bad), Err(Errno::EINVAL), "{bad:?}");
        assert_eq!(t.read("set_event"), "", "{bad:?} left something enabled");
    }
}

// See: events.rst 2.2, "Via the 'enable' toggle".
#[test]
fn enable_toggles_of_events_rst_2_2() {
    let t = Instance::new("enable");
    t.write("events/tsched/sched_wakeup/enable", "1\n").unwrap();
    assert_eq!(t.read("events/tsched/sched_wakeup/enable"), "1\n");
    assert_eq!(t.read("events/tsched/enable"), "X\n");
    t.write("events/tsched/sched_wakeup/enable", "0\n").unwrap();
    assert_eq!(t.read("events/tsched/sched_wakeup/enable"), "0\n");
    assert_eq!(t.read("events/tsched/enable"), "0\n");
    t.write("events/tsched/enable", "1\n").unwrap();
    assert_eq!(t.read("events/tsched/enable"), "1\n");
    assert_eq!(t.read("events/enable"), "X\n");
    t.write("events/enable", "1\n").unwrap();
    assert_eq!(t.read("events/enable"), "1\n");
    assert_eq!(t.read("events/tirq/softirq_entry/enable"), "1\n");
    t.write("events/enable", "0\n").unwrap();
    assert_eq!(t.read("events/enable"), "0\n");
    // kstrtoul accepts a leading zero and no trailing newline; nothing else.
    t.write("events/tirq/enable", "01").unwrap();
    assert_eq!(t.read("events/tirq/enable"), "1\n");
    for bad in ["2\n", "10\n", " 1\n", "0x1\n", "\n", "1x\n", "yes\n"] {
        assert_eq!(
            t.write("events/tirq/softirq_entry/enable", bad),
            Err(Errno::EINVAL),
            "{bad:?}"
        );
    }
    assert_eq!(t.read("events/tirq/softirq_entry/enable"), "1\n");
}

#[test]
fn unknown_paths_and_directory_misuse_give_the_kernels_errno() {
    let fs = ustrace::tracefs();
    assert_eq!(
        fs.open("nosuchfile", OpenFlags::READ).err(),
        Some(Errno::ENOENT)
    );
    assert_eq!(
        fs.open("events/nosys/enable", OpenFlags::READ).err(),
        Some(Errno::ENOENT)
    );
    assert_eq!(
        fs.open("events/tsched/nosuch/enable", OpenFlags::READ)
            .err(),
        Some(Errno::ENOENT)
    );
    assert_eq!(
        fs.open("events", OpenFlags::READ).err(),
        Some(Errno::EISDIR)
    );
    assert_eq!(
        fs.open("events/ftrace/print/enable", OpenFlags::READ).err(),
        Some(Errno::ENOENT)
    );
    assert_eq!(fs.mkdir("events/foo").err(), Some(Errno::EPERM));
    assert_eq!(fs.mkdir("instances/../x").err(), Some(Errno::EINVAL));
    assert_eq!(
        write("events/tsched/sched_switch/id", "1", false),
        Err(Errno::EINVAL)
    );
    let t = Instance::new("errno");
    assert_eq!(fs.mkdir("instances/errno").err(), Some(Errno::EEXIST));
    assert_eq!(t.write("tracing_on", "abc\n"), Err(Errno::EINVAL));
    assert_eq!(t.write("tracing_on", "\n"), Err(Errno::EINVAL));
    assert_eq!(t.write("buffer_size_kb", "0\n"), Err(Errno::EINVAL));
    assert_eq!(t.write("buffer_size_kb", "abc\n"), Err(Errno::EINVAL));
    assert_eq!(t.write("trace_clock", "nosuch\n"), Err(Errno::EINVAL));
    assert_eq!(t.write("trace_options", "nosuch\n"), Err(Errno::EINVAL));
    assert_eq!(t.write("options/raw", "2\n"), Err(Errno::EINVAL));
    assert_eq!(t.write("current_tracer", "nosuch\n"), Err(Errno::EINVAL));
}

#[test]
fn format_file_is_laid_out_like_the_kernels() {
    let format = read("events/tformat/all_kinds/format").unwrap();
    let id = read("events/tformat/all_kinds/id").unwrap();
    let golden = include_str!("golden/all_kinds.format").replace("@ID@", id.trim());
    assert_eq!(format, golden);
}

#[test]
fn available_events_lists_system_colon_event() {
    let events = read("available_events").unwrap();
    for line in [
        "tsched:sched_wakeup",
        "tirq:softirq_entry",
        "tformat:all_kinds",
    ] {
        assert!(events.lines().any(|l| l == line), "{line} missing");
    }
    assert!(!events.contains("ftrace:print"));
}

#[test]
fn trace_lines_have_the_kernels_layout() {
    let t = Instance::new("lines");
    t.write("events/tsched/enable", "1\n").unwrap();
    t.write("trace_marker", "hello there\n").unwrap();
    std::thread::Builder::new()
        .name("tracer-thread".into())
        .spawn(fire_all)
        .unwrap()
        .join()
        .unwrap();
    let trace = t.read("trace");
    let lines: Vec<&str> = trace.lines().collect();
    assert_eq!(lines[0], "# tracer: nop");
    assert!(
        lines[2].starts_with("# entries-in-buffer/entries-written: 3/3   #P:"),
        "{}",
        lines[2]
    );
    assert_eq!(
        lines[10],
        "#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION"
    );
    let body = body_lines(&trace);
    assert_eq!(body.len(), 3, "{trace}");
    // COMM-PID [CPU] FLAGS SECS.USECS: EVENT: TEXT
    let line = &body[1];
    let (context, rest) = line.split_once(": ").unwrap();
    assert_eq!(
        rest,
        "sched_wakeup: comm=kworker pid=42 prio=120 target_cpu=001"
    );
    assert_eq!(&context[..16], "   tracer-thread");
    assert_eq!(&context[16..17], "-");
    let pid: i32 = context[17..24].trim().parse().unwrap();
    assert!(pid > 0);
    assert_eq!(&context[24..26], " [");
    assert!(context[26..29].chars().all(|c| c.is_ascii_digit()));
    assert_eq!(&context[29..37], "] ..... ");
    let ts = context[37..].trim();
    let (secs, usecs) = ts.split_once('.').unwrap();
    assert!(secs.parse::<u64>().is_ok() && usecs.len() == 6, "{ts}");
    assert!(
        body[0].ends_with("tracing_mark_write: hello there"),
        "{}",
        body[0]
    );
    assert!(body[2].ends_with("sched_switch: prev_pid=1 ==> next_pid=42"));
}

#[test]
fn options_change_the_layout_like_the_kernels() {
    let t = Instance::new("opts");
    t.write("events/tirq/softirq_entry/enable", "1\n").unwrap();
    softirq_entry::trace(7);
    t.write("options/irq-info", "0\n").unwrap();
    let trace = t.read("trace");
    assert!(trace.contains("#           TASK-PID     CPU#     TIMESTAMP  FUNCTION\n"));
    let line = body_lines(&trace).pop().unwrap();
    // Without irq-info the flags column goes: "[CPU] " then " %5lu.%06lu".
    assert!(line[24..].starts_with(" ["));
    assert_eq!(&line[29..32], "]  ", "{line}");
    assert_eq!(line.as_bytes()[37], b'.', "{line}");
    t.write("trace_options", "nocontext-info\n").unwrap();
    assert_eq!(t.read("trace"), "# tracer: nop\n#\nsoftirq_entry: vec=7\n");
    assert!(t.read("trace_options").contains("nocontext-info\n"));
    t.write("options/context-info", "1\n").unwrap();
    t.write("options/raw", "1\n").unwrap();
    let raw = body_lines(&t.read("trace")).pop().unwrap();
    let id = read("events/tirq/softirq_entry/id").unwrap();
    assert!(raw.ends_with(&format!(" type: {}", id.trim())), "{raw}");
    assert_eq!(raw.split(' ').count(), 5, "{raw}");
}

#[test]
fn truncating_trace_clears_and_trace_pipe_consumes() {
    let t = Instance::new("pipe");
    t.write("events/tirq/softirq_entry/enable", "1\n").unwrap();
    for v in 0..5 {
        softirq_entry::trace(v);
    }
    assert_eq!(body_lines(&t.read("trace")).len(), 5);
    t.write("trace", "").unwrap();
    assert_eq!(body_lines(&t.read("trace")).len(), 0);
    softirq_entry::trace(99);
    let mut pipe = ustrace::tracefs()
        .open(&t.path("trace_pipe"), OpenFlags::READ)
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = pipe.read(&mut buf, Some(Duration::from_secs(5))).unwrap();
    let text = std::str::from_utf8(&buf[..n]).unwrap();
    assert!(text.ends_with("softirq_entry: vec=99\n"), "{text}");
    // Consumed: trace no longer shows it, and an empty pipe times out.
    assert_eq!(body_lines(&t.read("trace")).len(), 0);
    assert_eq!(
        pipe.read(&mut buf, Some(Duration::from_millis(50))).err(),
        Some(Errno::EAGAIN)
    );
    // An open reader keeps the instance.
    assert_eq!(
        ustrace::tracefs().rmdir(&t.path("")).err(),
        Some(Errno::EBUSY)
    );
    // A blocked reader wakes when an event arrives.
    let reader = std::thread::spawn(move || {
        let n = pipe.read(&mut buf, Some(Duration::from_secs(10))).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    });
    std::thread::sleep(Duration::from_millis(100));
    softirq_entry::trace(100);
    assert!(reader.join().unwrap().ends_with("softirq_entry: vec=100\n"));
}

#[test]
fn instances_are_independent() {
    let a = Instance::new("indep-a");
    ustrace::tracefs().mkdir("instances/indep-b").unwrap();
    let b = Instance("indep-b".into(), SERIAL_FREE.lock().unwrap());
    a.write("events/tirq/softirq_entry/enable", "1\n").unwrap();
    softirq_entry::trace(1);
    assert_eq!(body_lines(&a.read("trace")).len(), 1);
    assert_eq!(body_lines(&b.read("trace")).len(), 0);
    assert_eq!(b.read("events/tirq/softirq_entry/enable"), "0\n");
    a.write("tracing_on", "0\n").unwrap();
    assert_eq!(a.read("tracing_on"), "0\n");
    assert_eq!(b.read("tracing_on"), "1\n");
    softirq_entry::trace(2);
    assert_eq!(body_lines(&a.read("trace")).len(), 1);
    let names: Vec<String> = ustrace::tracefs()
        .readdir("instances")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&"indep-a".to_string()) && names.contains(&"indep-b".to_string()));
    assert!(ustrace::tracefs().stat("instances/indep-a/trace").is_ok());
    drop(a);
    assert_eq!(
        ustrace::tracefs().stat("instances/indep-a/trace").err(),
        Some(Errno::ENOENT)
    );
}

#[test]
fn trace_clock_lists_clocks_and_switches() {
    let t = Instance::new("clock");
    assert!(t.read("trace_clock").starts_with("[local] global counter"));
    t.write("trace_clock", "mono\n").unwrap();
    let listing = t.read("trace_clock");
    assert!(
        listing.contains("[mono]") && !listing.contains("[local]"),
        "{listing}"
    );
    t.write("trace_clock", "counter\n").unwrap();
    t.write("events/tirq/softirq_entry/enable", "1\n").unwrap();
    softirq_entry::trace(1);
    softirq_entry::trace(2);
    assert_eq!(body_lines(&t.read("trace")).len(), 2);
}

#[test]
fn snapshot_swaps_frees_and_clears() {
    let t = Instance::new("snap");
    assert!(t
        .read("snapshot")
        .starts_with("# *** SNAPSHOT NOT ALLOCATED ***"));
    t.write("events/tirq/softirq_entry/enable", "1\n").unwrap();
    softirq_entry::trace(1);
    t.write("snapshot", "1\n").unwrap();
    let snap = t.read("snapshot");
    assert!(snap.contains("# * Snapshot is allocated *"));
    assert!(snap.contains("softirq_entry: vec=1"), "{snap}");
    assert_eq!(
        body_lines(&t.read("trace")).len(),
        0,
        "live buffer continues empty"
    );
    softirq_entry::trace(2);
    assert!(t.read("trace").contains("vec=2"));
    t.write("snapshot", "2\n").unwrap();
    assert!(!t.read("snapshot").contains("vec=1"));
    t.write("snapshot", "0\n").unwrap();
    assert!(t
        .read("snapshot")
        .starts_with("# *** SNAPSHOT NOT ALLOCATED ***"));
}

#[test]
fn per_cpu_files_and_sizes() {
    let t = Instance::new("percpu");
    let cpus = ustrace::tracefs().readdir(&t.path("per_cpu")).unwrap();
    assert!(!cpus.is_empty());
    let stats = t.read("per_cpu/cpu0/stats");
    for key in [
        "entries:",
        "overrun:",
        "commit overrun:",
        "bytes:",
        "oldest event ts:",
        "now ts:",
        "dropped events:",
        "read events:",
    ] {
        assert!(stats.contains(key), "{key} missing in {stats}");
    }
    // The kernel rounds up to whole pages and shows the data bytes of those pages:
    // `echo 64 > buffer_size_kb` reads back 67 on the kernel too (17 pages of 4080 bytes).
    t.write("buffer_size_kb", "64\n").unwrap();
    assert_eq!(t.read("buffer_size_kb"), "67\n");
    let total: usize = t.read("buffer_total_size_kb").trim().parse().unwrap();
    assert_eq!(total, 67 * cpus.len());
    t.write("per_cpu/cpu0/buffer_size_kb", "8\n").unwrap();
    assert_eq!(t.read("per_cpu/cpu0/buffer_size_kb"), "11\n");
}

#[test]
fn an_event_too_big_for_a_page_shows_as_dropped() {
    let t = Instance::new("oversize");
    let cpus = ustrace::tracefs()
        .readdir(&t.path("per_cpu"))
        .unwrap()
        .len();
    let dropped = |t: &Instance| -> u64 {
        (0..cpus)
            .map(|c| {
                let stats = t.read(&format!("per_cpu/cpu{c}/stats"));
                let line = stats.lines().find(|l| l.starts_with("dropped events:"));
                line.and_then(|l| l.split(':').nth(1))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .expect("dropped events line")
            })
            .sum()
    };
    t.write("events/tirq/irq_handler_entry/enable", "1\n")
        .unwrap();
    let before = dropped(&t);
    irq_handler_entry::trace(9, &"x".repeat(5000));
    irq_handler_entry::trace(10, "small");
    assert_eq!(dropped(&t), before + 1, "the 5000-byte event is counted");
    let lines = body_lines(&t.read("trace"));
    assert!(
        lines.iter().any(|l| l.contains("irq=10 name=small")),
        "{lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("irq=9 ")), "{lines:?}");
}

#[test]
fn marker_respects_tracing_on_and_the_markers_option() {
    let t = Instance::new("marker");
    t.write("tracing_on", "0\n").unwrap();
    assert_eq!(t.write("trace_marker", "x"), Err(Errno::EBADF));
    t.write("tracing_on", "1\n").unwrap();
    t.write("options/markers", "0\n").unwrap();
    assert_eq!(t.write("trace_marker", "x"), Err(Errno::EINVAL));
    t.write("options/markers", "1\n").unwrap();
    t.write("trace_marker", "no newline").unwrap();
    assert!(t
        .read("trace")
        .ends_with("tracing_mark_write: no newline\n"));
}

#[test]
fn error_log_and_saved_cmdlines_exist() {
    let t = Instance::new("errlog");
    assert_eq!(t.read("error_log"), "");
    t.write("error_log", "").unwrap();
    assert!(read("saved_cmdlines").is_ok());
    assert_eq!(read("saved_cmdlines_size").unwrap(), "128\n");
    assert_eq!(
        read("instances/errlog/saved_cmdlines").err(),
        Some(Errno::ENOENT)
    );
}

/// Fires `sched_switch` once from a new thread named `name`, so its name is saved.
fn fire_from_thread(name: &str) -> i32 {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(|| {
            sched_switch::trace(7, 8);
            // SAFETY: gettid has no arguments and cannot fail.
            unsafe { libc::gettid() }
        })
        .unwrap()
        .join()
        .unwrap()
}

// ftrace.rst "saved_cmdlines_size"; the bounds are the kernel's (1..=PID_MAX_DEFAULT).
#[test]
fn saved_cmdlines_size_resizes_the_table_and_rejects_bad_sizes() {
    let t = Instance::new("cmdlines");
    t.write("events/tsched/sched_switch/enable", "1\n").unwrap();
    for bad in ["0\n", "99999999999\n", "32769\n", "-1\n", "abc\n"] {
        assert_eq!(
            write("saved_cmdlines_size", bad, false),
            Err(Errno::EINVAL),
            "{bad:?}"
        );
    }
    assert_eq!(
        write("saved_cmdlines_size", "18446744073709551616\n", false),
        Err(Errno(libc::ERANGE))
    );
    assert_eq!(read("saved_cmdlines_size").unwrap(), "128\n");

    write("saved_cmdlines_size", "2\n", false).unwrap();
    assert_eq!(read("saved_cmdlines_size").unwrap(), "2\n");
    let tids: Vec<i32> = ["cmdA", "cmdB", "cmdC"]
        .iter()
        .map(|n| fire_from_thread(n))
        .collect();
    let saved = read("saved_cmdlines").unwrap();
    write("saved_cmdlines_size", "128\n", false).unwrap();
    // The first thread's slot was taken by the third: only the last two distinct threads.
    assert_eq!(
        saved,
        format!("{} cmdB\n{} cmdC\n", tids[1], tids[2]),
        "saved_cmdlines with size 2"
    );
    // Growing keeps what was there.
    let grown = read("saved_cmdlines").unwrap();
    assert!(grown.contains(&format!("{} cmdB\n", tids[1])), "{grown}");
    assert!(grown.contains(&format!("{} cmdC\n", tids[2])), "{grown}");
    write("saved_cmdlines_size", "32768\n", false).unwrap();
    write("saved_cmdlines_size", "128\n", false).unwrap();
    t.write("events/tsched/sched_switch/enable", "0\n").unwrap();
}

#[test]
fn reading_trace_marker_is_einval() {
    let t = Instance::new("marker-read");
    assert_eq!(read(&t.path("trace_marker")).err(), Some(Errno::EINVAL));
    assert_eq!(read("trace_marker").err(), Some(Errno::EINVAL));
}

#[test]
fn instance_names_follow_the_vfs_limits() {
    let fs = ustrace::tracefs();
    let long = "n".repeat(256);
    assert_eq!(
        fs.mkdir(&format!("instances/{long}")),
        Err(Errno(libc::ENAMETOOLONG))
    );
    assert_eq!(
        fs.stat(&format!("instances/{long}")).err(),
        Some(Errno(libc::ENAMETOOLONG))
    );
    assert!(ustrace::trace::tracing().create_instance(&long).is_err());
    // 255 bytes and any other bytes are fine, as on the kernel.
    for name in [
        "m".repeat(255),
        "a b:c*d".to_string(),
        "tab\there".to_string(),
    ] {
        fs.mkdir(&format!("instances/{name}")).unwrap();
        fs.rmdir(&format!("instances/{name}")).unwrap();
    }
}

// ftrace.rst/README: `set_event` takes `:mod:MODULE`; a module is the declaring crate,
// here this test binary's crate, `tracefs`.
#[test]
fn set_event_mod_selects_the_events_a_crate_declares() {
    let t = Instance::new("set-event-mod");
    t.write("set_event", ":mod:tracefs\n").unwrap();
    let all = t.read("set_event");
    assert_eq!(
        all,
        "tformat:all_kinds\ntirq:irq_handler_entry\ntirq:softirq_entry\n\
         tsched:sched_switch\ntsched:sched_wakeup\n"
    );
    t.append("set_event", "!tirq:mod:tracefs\n").unwrap();
    assert_eq!(
        t.read("set_event"),
        "tformat:all_kinds\ntsched:sched_switch\ntsched:sched_wakeup\n"
    );
    t.write("set_event", "tsched:sched_switch:mod:tracefs\n")
        .unwrap();
    assert_eq!(t.read("set_event"), "tsched:sched_switch\n");
    t.write("set_event", "*:mod:tracefs\n").unwrap();
    assert_eq!(t.read("set_event"), all);
    t.write("set_event", "!*:*:mod:tracefs\n").unwrap();
    assert_eq!(t.read("set_event"), "");
    // A crate that declares no events, or none of those named: EINVAL, nothing applied.
    t.write("set_event", "tsched\n").unwrap();
    for bad in [
        ":mod:nosuchcrate\n",
        "tsched:mod:ustrace\n",
        "tirq sched_switch:mod:nosuch\n",
    ] {
        assert_eq!(t.append("set_event", bad), Err(Errno::EINVAL), "{bad:?}");
    }
    assert_eq!(
        t.read("set_event"),
        "tsched:sched_switch\ntsched:sched_wakeup\n"
    );
}

// ftrace.rst "tracing_cpumask": events on a CPU left out of the mask are not recorded.
#[test]
fn tracing_cpumask_keeps_out_events_of_masked_cpus() {
    let nr = ustrace::trace::tracing().top().buffer().nr_cpus();
    let allowed = cpus::allowed_cpus();
    let usable = allowed.contains(&0) && allowed.contains(&1);
    if nr < 2 || !usable {
        eprintln!("skipped: needs CPUs 0 and 1 (have {nr} buffers)");
        return;
    }
    let t = Instance::new("cpumask");
    let full = t.read("tracing_cpumask");
    assert_eq!(
        read("tracing_cpumask").unwrap(),
        full,
        "top and instance agree"
    );
    t.write("events/tsched/sched_switch/enable", "1\n").unwrap();
    // Only CPU 1.
    t.write("tracing_cpumask", "2\n").unwrap();
    assert!(t
        .read("tracing_cpumask")
        .trim_start_matches('0')
        .starts_with('2'));
    let marker = t.path("trace_marker");
    cpus::on_cpu(0, move || {
        sched_switch::trace(100, 0);
        common::write(&marker, "from cpu0").unwrap();
    });
    let marker = t.path("trace_marker");
    cpus::on_cpu(1, move || {
        sched_switch::trace(101, 1);
        common::write(&marker, "from cpu1").unwrap();
    });
    let lines = body_lines(&t.read("trace"));
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].contains("[001]") && lines[0].contains("prev_pid=101"),
        "{lines:?}"
    );
    assert!(
        lines[1].contains("[001]") && lines[1].contains("from cpu1"),
        "{lines:?}"
    );
    // Triggers still run on a masked CPU's events, as the kernel's do.
    t.write("events/tsched/sched_switch/trigger", "traceoff\n")
        .unwrap();
    cpus::on_cpu(0, || sched_switch::trace(102, 0));
    assert_eq!(t.read("tracing_on"), "0\n");
    t.write("events/tsched/sched_switch/trigger", "!traceoff\n")
        .unwrap();
    t.write("tracing_on", "1\n").unwrap();
    // A rejected write keeps the mask; the full mask records everywhere again.
    assert_eq!(t.write("tracing_cpumask", "g\n"), Err(Errno::EINVAL));
    assert!(t
        .read("tracing_cpumask")
        .trim_start_matches('0')
        .starts_with('2'));
    t.write("tracing_cpumask", &full).unwrap();
    assert_eq!(t.read("tracing_cpumask"), full);
    cpus::on_cpu(0, || sched_switch::trace(103, 0));
    let lines = body_lines(&t.read("trace"));
    assert!(
        lines
            .iter()
            .any(|l| l.contains("[000]") && l.contains("prev_pid=103")),
        "{lines:?}"
    );
    // Other instances were never masked.
    assert_eq!(read("tracing_cpumask").unwrap(), full);
}

fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

// ftrace.rst `event-fork`: the kernel's tasks are threads, so a thread created by a
// listed thread is traced too, and leaves the list when it exits.
#[test]
fn event_fork_follows_new_threads_and_their_exit() {
    let t = Instance::new("event-fork-threads");
    t.write("events/tsched/sched_switch/enable", "1\n").unwrap();
    t.write("options/event-fork", "1\n").unwrap();
    let me = gettid();
    t.write("set_event_pid", &format!("{me}\n")).unwrap();
    let pids_path = t.path("set_event_pid");
    let (child, seen_inside, grandchild, seen_by_grandchild) = std::thread::spawn(move || {
        let child = gettid();
        sched_switch::trace(child, 1);
        let seen = read(&pids_path).unwrap();
        // A thread of a followed thread is followed too.
        let pids_path2 = pids_path.clone();
        let (grandchild, seen2) = std::thread::spawn(move || {
            sched_switch::trace(gettid(), 2);
            (gettid(), read(&pids_path2).unwrap())
        })
        .join()
        .unwrap();
        (child, seen, grandchild, seen2)
    })
    .join()
    .unwrap();
    assert_eq!(seen_inside, sorted(&[me, child]));
    assert_eq!(seen_by_grandchild, sorted(&[me, child, grandchild]));
    // Both have exited: gone from the list.
    assert_eq!(t.read("set_event_pid"), format!("{me}\n"));
    let lines = body_lines(&t.read("trace"));
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].contains(&format!("prev_pid={child} ")),
        "{lines:?}"
    );
    assert!(
        lines[1].contains(&format!("prev_pid={grandchild} ")),
        "{lines:?}"
    );

    // Without event-fork, a new thread is not added.
    t.write("options/event-fork", "0\n").unwrap();
    let pids_path = t.path("set_event_pid");
    let seen = std::thread::spawn(move || {
        sched_switch::trace(gettid(), 3);
        read(&pids_path).unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(seen, format!("{me}\n"));
    assert_eq!(body_lines(&t.read("trace")).len(), 2);
}

fn sorted(pids: &[i32]) -> String {
    let mut pids = pids.to_vec();
    pids.sort();
    pids.iter().map(|p| format!("{p}\n")).collect()
}
