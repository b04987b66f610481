//! fprobetrace.rst and eprobetrace.rst, example by example, on user-space equivalents: a
//! `vfs_read`-like function, a `vfs_open`-like one whose callee updates a struct, a
//! tracepoint, and a static event for eprobes.

mod common;

use common::{append, write};
use ustrace::{Errno, FileSystem};

/// Shaped like the kernel's `struct file`, as far as the examples look into it.
#[repr(C)]
pub struct File {
    pub f_mode: u32,
    pub f_inode: u64,
}

/// A `vfs_read`-like function (the examples' first probe point).
#[no_mangle]
#[inline(never)]
pub extern "C" fn vfs_read(file: *mut File, buf: *mut u8, count: usize, pos: *mut i64) -> isize {
    std::hint::black_box((file, buf, pos));
    count as isize
}

/// A `vfs_open`-like function: the callee fills in the struct, as the exit-args example needs.
#[no_mangle]
#[inline(never)]
pub extern "C" fn vfs_open(path: *const std::ffi::c_char, file: &mut File) -> i32 {
    std::hint::black_box(path);
    file.f_mode = 0x4d801e;
    file.f_inode = 0xffff_8880_0847_0168;
    0
}

#[derive(Clone, Copy)]
pub struct Task {
    pub pid: i32,
    pub prio: i32,
}

ustrace::declare_tracepoint! {
    /// Like the kernel's raw `sched_switch` tracepoint: pointers to tasks.
    pub fn dyn_sched_switch(preempt: bool, prev: &Task, next: &Task);
}

ustrace::trace_event! {
    pub fn dsched::waking(comm: &str, pid: i32, prio: i32) {
        comm: &str = comm,
        pid: i32 = pid,
        prio: i32 = prio,
    }
    print "comm=%s pid=%d prio=%d", comm, pid, prio;
}

ustrace::trace_event! {
    /// Fields of every width, signed and not, adjacent and apart, and a string: what an
    /// eprobe's precompiled field copies must move exactly.
    /// `tail` carries `uh` in its low 16 bits and `uw` above them (seven arguments at most).
    pub fn dsched::mixed(b: i8, h: i16, w: i32, q: u64, name: &str, u: u8, tail: u64) {
        b: i8 = b,
        h: i16 = h,
        w: i32 = w,
        q: u64 = q,
        name: &str = name,
        u: u8 = u,
        uh: u16 = tail as u16,
        uw: u32 = (tail >> 16) as u32,
    }
    print "b=%d h=%d w=%d q=%llu name=%s u=%u uh=%u uw=%u", b, h, w, q, name, u, uh, uw;
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn read(path: &str) -> String {
    common::read(path).unwrap()
}

/// A test's instance; dynamic events are process-wide, so tests run one at a time and clean
/// them up.
struct Scope(
    &'static str,
    #[allow(dead_code)] std::sync::MutexGuard<'static, ()>,
);

impl Scope {
    fn new(name: &'static str) -> Scope {
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let _ = ustrace::tracefs().rmdir(&format!("instances/{name}"));
        ustrace::tracefs()
            .mkdir(&format!("instances/{name}"))
            .unwrap();
        Scope(name, guard)
    }
    fn p(&self, path: &str) -> String {
        format!("instances/{}/{path}", self.0)
    }
    fn lines(&self) -> Vec<String> {
        read(&self.p("trace"))
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(String::from)
            .collect()
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let _ = write(&self.p("events/enable"), "0\n");
        let _ = ustrace::tracefs().rmdir(&format!("instances/{}", self.0));
        let _ = write("dynamic_events", "");
    }
}

/// Appends a definition whose arguments come from debug-info types. This workspace's
/// release profile keeps line tables only (`debug = 1`), where the kernel's answers ("BTF is
/// not available", "No BTF entry for this probe point") are the right ones: there the test
/// says so and is skipped. A debug build must have the types, so there it fails.
fn append_typed(def: &str) -> bool {
    match append("dynamic_events", def) {
        Ok(()) => true,
        Err(e) => {
            let log = read("error_log");
            let no_types = log.contains("BTF is not available") || log.contains("No BTF entry");
            if no_types && !cfg!(debug_assertions) {
                eprintln!("skipped: no type information in this build (line tables only)");
                return false;
            }
            panic!("{def:?}: {e:?}\n{log}");
        }
    }
}

fn text_of(line: &str) -> &str {
    line.split_once(": ").map_or(line, |(_, rest)| rest)
}

// See: fprobetrace.rst "Usage examples", the vfs_read entry and exit probes with BTF args.
#[test]
fn fprobe_events_on_entry_and_exit_with_named_args() {
    let t = Scope::new("dyn-vfs-read");
    if !append_typed("f vfs_read $arg*\n") {
        return;
    }
    append("dynamic_events", "f vfs_read%return $retval\n").unwrap();
    assert_eq!(
        read("dynamic_events"),
        "f:fprobes/vfs_read__entry vfs_read file=file buf=buf count=count pos=pos\n\
         f:fprobes/vfs_read__exit vfs_read%return arg1=$retval\n"
    );
    let format = read("events/fprobes/vfs_read__entry/format");
    assert!(
        format.contains("\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n"),
        "{format}"
    );
    assert!(read("available_events").contains("fprobes:vfs_read__entry\n"));
    write(&t.p("events/fprobes/enable"), "1\n").unwrap();
    assert!(
        read("enabled_functions").contains("vfs_read"),
        "{}",
        read("enabled_functions")
    );
    let mut file = File {
        f_mode: 0,
        f_inode: 0,
    };
    let mut buf = [0u8; 4];
    let mut pos = 0i64;
    assert_eq!(vfs_read(&mut file, buf.as_mut_ptr(), 1, &mut pos), 1);
    let lines = t.lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let entry = text_of(&lines[0]);
    assert!(
        entry.starts_with("vfs_read__entry: (vfs_read+0x"),
        "{entry}"
    );
    assert!(
        entry.contains(&format!(" file=0x{:x}", &file as *const File as usize)),
        "{entry}"
    );
    assert!(entry.contains(" count=1 "), "{entry}");
    let exit = text_of(&lines[1]);
    assert!(exit.starts_with("vfs_read__exit: ("), "{exit}");
    assert!(exit.contains(" <- vfs_read) arg1=1"), "{exit}");
    // Busy while enabled: neither removal nor truncation goes through.
    assert_eq!(
        append("dynamic_events", "-:fprobes/vfs_read__entry\n"),
        Err(Errno::EBUSY)
    );
    assert_eq!(write("dynamic_events", ""), Err(Errno::EBUSY));
    write(&t.p("events/fprobes/enable"), "0\n").unwrap();
    append("dynamic_events", "-:fprobes/vfs_read__entry\n").unwrap();
    assert_eq!(
        read("dynamic_events"),
        "f:fprobes/vfs_read__exit vfs_read%return arg1=$retval\n"
    );
}

// See: fprobetrace.rst, the vfs_open example: an exit probe reads what the callee wrote.
#[test]
fn exit_probes_see_what_the_function_wrote() {
    let t = Scope::new("dyn-vfs-open");
    if !append_typed("f vfs_open mode=file->f_mode:x32 inode=file->f_inode:x64\n") {
        return;
    }
    append(
        "dynamic_events",
        "f vfs_open%return mode=file->f_mode:x32 inode=file->f_inode:x64\n",
    )
    .unwrap();
    write(&t.p("events/fprobes/enable"), "1\n").unwrap();
    let mut file = File {
        f_mode: 0x2,
        f_inode: 0,
    };
    vfs_open(c"/etc/passwd".as_ptr(), &mut file);
    let lines = t.lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        text_of(&lines[0]).ends_with(" mode=0x2 inode=0x0"),
        "{}",
        lines[0]
    );
    assert!(
        text_of(&lines[1]).ends_with(" <- vfs_open) mode=0x4d801e inode=0xffff888008470168"),
        "{}",
        lines[1]
    );
}

// See: fprobetrace.rst, the sched_switch tracepoint probe: raw arguments, then a field
// read through a pointer.
#[test]
fn tracepoint_probes_see_raw_arguments() {
    let t = Scope::new("dyn-tp");
    append(
        "dynamic_events",
        "t dyn_sched_switch preempt=$arg1 next_pid=+0($arg3):s32\n",
    )
    .unwrap();
    assert_eq!(
        read("dynamic_events"),
        "t:tracepoints/dyn_sched_switch dyn_sched_switch preempt=$arg1 next_pid=+0($arg3):s32\n"
    );
    write(&t.p("events/tracepoints/dyn_sched_switch/enable"), "1\n").unwrap();
    let (prev, next) = (Task { pid: 70, prio: 120 }, Task { pid: 16, prio: 98 });
    dyn_sched_switch::trace(false, &prev, &next);
    let lines = t.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        text_of(&lines[0]).ends_with(" preempt=0x0 next_pid=16"),
        "{}",
        lines[0]
    );
}

// See: eprobetrace.rst, Example 1: an eprobe on another event, with a field of it and a
// filter.
#[test]
fn eprobes_derive_events_from_other_events() {
    let t = Scope::new("dyn-eprobe");
    append(
        "dynamic_events",
        "e:eprobes/high_prio dsched.waking pid=$pid:u32 raw=$pid comm=$comm:string if prio < 100\n",
    )
    .unwrap();
    assert!(
        read("dynamic_events").contains("e:eprobes/high_prio dsched.waking"),
        "{}",
        read("dynamic_events")
    );
    write(&t.p("events/eprobes/high_prio/enable"), "1\n").unwrap();
    // The source event is off: the eprobe holds it in soft mode.
    assert_eq!(read(&t.p("events/dsched/waking/enable")), "0*\n");
    waking::trace("kworker", 12, 120);
    waking::trace("rcu_preempt", 16, 98);
    let lines = t.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        text_of(&lines[0]).starts_with("high_prio: (dsched.waking)"),
        "{}",
        lines[0]
    );
    // Typed as the document types it, and untyped, which "would default showing in
    // hexadecimal" (eprobetrace.rst).
    assert!(
        text_of(&lines[0]).contains(" pid=16 raw=0x10 "),
        "{}",
        lines[0]
    );
    assert!(
        text_of(&lines[0]).contains("comm=\"rcu_preempt\""),
        "{}",
        lines[0]
    );
    // Filters and triggers work on it like on any event.
    write(&t.p("events/eprobes/high_prio/filter"), "pid == 1\n").unwrap();
    waking::trace("rcu_preempt", 16, 98);
    assert_eq!(t.lines().len(), 1);
    write(&t.p("events/eprobes/high_prio/enable"), "0\n").unwrap();
    assert_eq!(read(&t.p("events/dsched/waking/enable")), "0\n");
}

// An eprobe reading every field of an event of mixed widths: as they are, adjacent ones
// together, narrowed, widened (sign- and zero-extended), around a string, each value checked.
#[test]
fn eprobes_copy_fields_of_every_width() {
    let t = Scope::new("dyn-eprobe-mixed");
    let def = concat!(
        "e:eprobes/mixed dsched.mixed b=$b:s8 h=$h:s16 w=$w:s32 q=$q:x64 name=$name:string ",
        "u=$u:u8 uh=$uh:x16 uw=$uw:u32 bw=$b:s64 hw=$h:u32 qn=$q:u16 wn=$w:s8 uq=$u:x64 ",
        "raw=$uw\n"
    );
    append("dynamic_events", def).unwrap();
    write(&t.p("events/eprobes/mixed/enable"), "1\n").unwrap();
    mixed::trace(
        -5,
        -300,
        -70000,
        0x0102_0304_0506_0708,
        "strawberry",
        0xfe,
        (4_000_000_000 << 16) | 0xbeef,
    );
    mixed::trace(
        127,
        32767,
        i32::MAX,
        u64::MAX,
        "",
        0,
        (0x8000_0001 << 16) | 1,
    );
    let lines = t.lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(
        text_of(&lines[0]),
        concat!(
            "mixed: (dsched.mixed) b=-5 h=-300 w=-70000 q=0x102030405060708 ",
            "name=\"strawberry\" u=254 uh=0xbeef uw=4000000000 bw=-5 hw=4294966996 ",
            "qn=1800 wn=-112 uq=0xfe raw=0xee6b2800"
        ),
    );
    assert_eq!(
        text_of(&lines[1]),
        concat!(
            "mixed: (dsched.mixed) b=127 h=32767 w=2147483647 q=0xffffffffffffffff ",
            "name=\"\" u=0 uh=0x1 uw=2147483649 bw=127 hw=32767 qn=65535 wn=-1 uq=0x0 ",
            "raw=0x80000001"
        ),
    );
    write(&t.p("events/eprobes/mixed/enable"), "0\n").unwrap();
}

#[test]
fn bad_definitions_fail_with_the_kernels_errors() {
    let _t = Scope::new("dyn-errors");
    let _ = write("error_log", "");
    assert!(append("dynamic_events", "f no_such_function_anywhere\n").is_err());
    assert!(append("dynamic_events", "f vfs_read $arg1:nosuchtype\n").is_err());
    let log = read("error_log");
    assert!(log.contains("trace_fprobe: error: "), "{log}");
    assert!(log.contains("  Command: "), "{log}");
    assert_eq!(
        append("dynamic_events", "-:fprobes/nothing_here\n"),
        Err(Errno::ENOENT)
    );
    assert_eq!(read("dynamic_events"), "");
}

/// A function the in-process builder test probes.
#[no_mangle]
#[inline(never)]
pub extern "C" fn parse_header(buf: *const u8, len: usize, flags: u32) -> i32 {
    std::hint::black_box(buf);
    (len as i32) + flags as i32
}

// See: events.rst 7.3 and 7.4, the in-kernel dynamic event API.
#[test]
fn events_built_in_code_go_through_the_same_parser() {
    use ustrace::dynevent_cmd::{delete, DynEventCmd};
    let t = Scope::new("dyn-builder");
    let mut cmd = DynEventCmd::fprobe("gen_fprobe_test", "parse_header");
    cmd.group("gen")
        .add_field("len=$arg2")
        .add_fields(["flags=$arg3:u32", "first=+0($arg1):u8"]);
    assert_eq!(
        cmd.text(),
        "f:gen/gen_fprobe_test parse_header len=$arg2 flags=$arg3:u32 first=+0($arg1):u8"
    );
    let id = cmd.create().unwrap();
    assert_eq!(
        read("events/gen/gen_fprobe_test/id").trim(),
        id.0.to_string()
    );
    write(&t.p("events/gen/gen_fprobe_test/enable"), "1\n").unwrap();
    parse_header(b"Hdr".as_ptr(), 3, 4);
    let lines = t.lines();
    assert!(
        text_of(&lines[0]).ends_with(" len=0x3 flags=4 first=72"),
        "{lines:?}"
    );
    assert_eq!(
        delete(Some("gen"), "gen_fprobe_test").unwrap_err().errno,
        Errno::EBUSY
    );
    write(&t.p("events/gen/gen_fprobe_test/enable"), "0\n").unwrap();
    delete(Some("gen"), "gen_fprobe_test").unwrap();
    let bad = DynEventCmd::fprobe("bad", "parse_header")
        .add_field("x=$arg1:nosuchtype")
        .create();
    let err = bad.unwrap_err();
    assert_eq!(err.errno, Errno::EINVAL);
    assert!(err.log.unwrap().starts_with("trace_fprobe: error: "));
}

ustrace::declare_tracepoint! {
    /// A request with a string and integers, for named tracepoint-probe arguments.
    pub fn dyn_request(method: &str, status: u16, latency: i64, task: &Task);
}

// See: fprobetrace.rst, tracepoint probes with named arguments ("t sched_switch $arg*"):
// names and types come from the tracepoint macro's declaration.
#[test]
fn tracepoint_probes_take_names_and_types_from_the_declaration() {
    let t = Scope::new("dyn-tp-named");
    append("dynamic_events", "t dyn_request $arg*\n").unwrap();
    assert_eq!(
        read("dynamic_events"),
        "t:tracepoints/dyn_request dyn_request method=method method_len=method_len status=status latency=latency task=task\n"
    );
    append(
        "dynamic_events",
        "t:tracepoints/req2 dyn_request m=+0(method):u8 status latency pid=+0(task):s32\n",
    )
    .unwrap();
    write(&t.p("events/tracepoints/enable"), "1\n").unwrap();
    let task = Task { pid: 4242, prio: 1 };
    dyn_request::trace("GET", 404, -7, &task);
    let lines = t.lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        text_of(&lines[0]).contains(" method_len=3 status=404 latency=-7 task=0x"),
        "{}",
        lines[0]
    );
    assert!(
        text_of(&lines[1]).ends_with(" m=71 status=404 latency=-7 pid=4242"),
        "{}",
        lines[1]
    );
}

// See: eprobetrace.rst "Attaching to dynamic events": eprobes on fprobe events and on other
// eprobes.
#[test]
fn eprobes_attach_to_fprobe_events_and_to_eprobes() {
    let t = Scope::new("dyn-eprobe-chain");
    append("dynamic_events", "f:fprobes/rd vfs_read count=$arg3:u64\n").unwrap();
    append(
        "dynamic_events",
        "e:eprobes/rd_count fprobes.rd n=$count:u64 if count > 1\n",
    )
    .unwrap();
    append(
        "dynamic_events",
        "e:eprobes/rd_again eprobes.rd_count again=$n:u64\n",
    )
    .unwrap();
    write(&t.p("events/eprobes/enable"), "1\n").unwrap();
    // The fprobe event itself is off: the eprobe holds it in soft mode.
    assert_eq!(read(&t.p("events/fprobes/rd/enable")), "0*\n");
    let mut file = File {
        f_mode: 0,
        f_inode: 0,
    };
    let (mut buf, mut pos) = ([0u8; 8], 0i64);
    vfs_read(&mut file, buf.as_mut_ptr(), 1, &mut pos);
    vfs_read(&mut file, buf.as_mut_ptr(), 5, &mut pos);
    let lines = t.lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        text_of(&lines[0]).ends_with("rd_count: (fprobes.rd) n=5"),
        "{}",
        lines[0]
    );
    assert!(
        text_of(&lines[1]).ends_with("rd_again: (eprobes.rd_count) again=5"),
        "{}",
        lines[1]
    );
    // A source in use by an eprobe cannot go away.
    assert_eq!(
        append("dynamic_events", "-:fprobes/rd\n"),
        Err(Errno::EBUSY)
    );
    write(&t.p("events/eprobes/enable"), "0\n").unwrap();
    append("dynamic_events", "-:eprobes/rd_again\n").unwrap();
    append("dynamic_events", "-:eprobes/rd_count\n").unwrap();
    append("dynamic_events", "-:fprobes/rd\n").unwrap();
}

/// The newest `error_log` entry without its `[timestamp] ` prefix.
fn last_error() -> String {
    let log = read("error_log");
    let start = log.rfind("\n[").map_or(0, |p| p + 1);
    let entry = &log[start..];
    entry
        .split_once("] ")
        .map_or(entry, |(_, rest)| rest)
        .to_string()
}

/// The function names `available_filter_functions` lists for `object`, as listed.
fn listed_in(object: &str) -> Vec<String> {
    let suffix = format!(" [{object}]");
    read("available_filter_functions")
        .lines()
        .filter_map(|l| l.strip_suffix(&suffix))
        .map(String::from)
        .collect()
}

// Issue 15 item 12: a listed name is a name `f` accepts, versioned libc symbols included.
#[test]
fn every_listed_libc_function_resolves() {
    let _t = Scope::new("dyn-libc-names");
    let names = listed_in("libc.so.6");
    if names.len() < 100 {
        eprintln!("skipped: libc lists only {} functions here", names.len());
        return;
    }
    let inventory = ustrace_inspect::symbols::inventory();
    for name in &names {
        assert!(
            !inventory.find(name).is_empty(),
            "{name} is listed but not found"
        );
        // The version-less name of a listed versioned one resolves too.
        let bare = name.split('@').next().unwrap();
        assert!(
            !inventory.find(bare).is_empty(),
            "{bare} (listed as {name}) not found"
        );
    }
    // Through `dynamic_events`: the three names of the issue and a sample of the rest.
    // A function the patcher cannot handle is refused as one that cannot be registered,
    // never as one that does not exist.
    let mut sample: Vec<String> = ["clock_nanosleep", "realpath", "pthread_cond_wait"]
        .map(String::from)
        .to_vec();
    sample.extend(names.iter().step_by(names.len() / 40).cloned());
    let mut created = 0;
    for (i, name) in sample.iter().enumerate() {
        let _ = write("error_log", "");
        match append("dynamic_events", &format!("f:libc/f{i} {name}\n")) {
            Ok(()) => created += 1,
            Err(e) => {
                assert_eq!(e, Errno::EINVAL, "{name}");
                let log = last_error();
                assert!(
                    log.starts_with("trace_fprobe: error: Failed to register probe event\n"),
                    "{name}: {log}"
                );
            }
        }
    }
    assert!(created > sample.len() / 2, "{created} of {}", sample.len());
    let listing = read("dynamic_events");
    for name in ["realpath", "pthread_cond_wait"] {
        assert!(
            listing.lines().any(|l| l.ends_with(&format!(" {name}"))),
            "{name} not probed:\n{listing}"
        );
    }
}

// Issue 15 item 12: `name@VERSION` names one version, `name` the default one, as dlvsym
// and dlsym resolve them.
#[test]
fn symbol_versions_select_the_definition() {
    let t = Scope::new("dyn-versions");
    let addr = |spec: &str| {
        ustrace_inspect::symbols::inventory()
            .find(spec)
            .first()
            .map(|s| s.addr)
    };
    // SAFETY: dlsym/dlvsym with NUL-terminated names only read the loader's tables.
    let (new, old, default) = unsafe {
        (
            libc::dlvsym(
                libc::RTLD_DEFAULT,
                c"pthread_cond_wait".as_ptr(),
                c"GLIBC_2.3.2".as_ptr(),
            ) as usize,
            libc::dlvsym(
                libc::RTLD_DEFAULT,
                c"pthread_cond_wait".as_ptr(),
                c"GLIBC_2.2.5".as_ptr(),
            ) as usize,
            libc::dlsym(libc::RTLD_DEFAULT, c"pthread_cond_wait".as_ptr()) as usize,
        )
    };
    if new == 0 || old == 0 || !listed_in("libc.so.6").iter().any(|n| n.contains('@')) {
        eprintln!("skipped: this libc's symbol table has no pthread_cond_wait versions");
        return;
    }
    assert_eq!(addr("pthread_cond_wait"), Some(default));
    assert_eq!(addr("pthread_cond_wait@GLIBC_2.2.5"), Some(old));
    assert_eq!(addr("pthread_cond_wait@GLIBC_2.3.2"), Some(new));
    assert_eq!(addr("pthread_cond_wait@@GLIBC_2.3.2"), Some(new));
    // An IFUNC with versions (memcpy@@GLIBC_2.14 next to memcpy@GLIBC_2.2.5): listed at
    // the implementation its resolver chose, which is what the bare name means.
    // SAFETY: as above.
    // (ld.so has a `memcpy` of its own, which the bare name names too.)
    let memcpy = unsafe {
        libc::dlvsym(
            libc::RTLD_DEFAULT,
            c"memcpy".as_ptr(),
            c"GLIBC_2.14".as_ptr(),
        )
    } as usize;
    assert_ne!(memcpy, 0);
    let found: Vec<String> = ustrace_inspect::symbols::inventory()
        .find("memcpy")
        .iter()
        .filter(|s| s.object_name() == "libc.so.6")
        .map(|s| format!("{} {:#x}", s.name, s.addr))
        .collect();
    assert_eq!(found, [format!("memcpy@@GLIBC_2.14 {memcpy:#x}")]);
    assert!(listed_in("libc.so.6")
        .iter()
        .any(|n| n.starts_with("memcpy@@")));
    append("dynamic_events", "f:v/old pthread_cond_wait@GLIBC_2.2.5\n").unwrap();
    append("dynamic_events", "f:v/new pthread_cond_wait@GLIBC_2.3.2\n").unwrap();
    append("dynamic_events", "f:v/rp realpath@GLIBC_2.3\n").unwrap();
    // `@@` is the default version only.
    assert_eq!(
        append("dynamic_events", "f:v/bad pthread_cond_wait@@GLIBC_2.2.5\n"),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        read("dynamic_events"),
        "f:v/old pthread_cond_wait@GLIBC_2.2.5\n\
         f:v/new pthread_cond_wait@GLIBC_2.3.2\n\
         f:v/rp realpath@GLIBC_2.3\n"
    );
    // The probe sits on the definition the version names: a call of `realpath` (the
    // default version, what this program links to) hits it.
    write(&t.p("events/v/rp/enable"), "1\n").unwrap();
    let mut buf = [0 as libc::c_char; libc::PATH_MAX as usize];
    // SAFETY: a NUL-terminated path and a PATH_MAX buffer, as realpath(3) asks.
    let resolved = unsafe { libc::realpath(c"/".as_ptr(), buf.as_mut_ptr()) };
    assert!(!resolved.is_null());
    let lines = t.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        text_of(&lines[0]).starts_with("rp: (realpath@@GLIBC_2.3+0x"),
        "{}",
        lines[0]
    );
}

// Issue 15 item 12: a function that is not there is logged as the kernel (6.18,
// trace_fprobe.c) logs it: "Invalid probed address or symbol" under the symbol, EINVAL.
#[test]
fn a_missing_function_is_logged_like_the_kernel() {
    let _t = Scope::new("dyn-missing");
    let _ = write("error_log", "");
    for (command, caret) in [
        ("f:test/x no_such_function_xyz", 9),
        ("f no_such_function_xyz%return $retval", 2),
        ("f:test/y realpath@GLIBC_9.9", 9),
    ] {
        assert_eq!(
            append("dynamic_events", &format!("{command}\n")),
            Err(Errno::EINVAL),
            "{command}"
        );
        assert_eq!(
            last_error(),
            format!(
                "trace_fprobe: error: Invalid probed address or symbol\n  Command: {command}\n{}^\n",
                " ".repeat("  Command: ".len() + caret)
            )
        );
    }
    assert_eq!(read("dynamic_events"), "");
    // The in-process builder reports the same entry.
    let err = ustrace::dynevent_cmd::DynEventCmd::fprobe("gen_missing", "no_such_function_xyz")
        .create()
        .unwrap_err();
    assert_eq!(err.errno, Errno::EINVAL);
    assert!(
        err.log
            .as_deref()
            .is_some_and(|l| l.contains("Invalid probed address or symbol")),
        "{err:?}"
    );
}

// Issue 15 item 15: the listing of each kind, golden, as the kernel's show functions print
// it (trace_fprobe.c trace_fprobe_show, trace_eprobe.c eprobe_dyn_event_show: an eprobe's
// `if FILTER` is applied but never listed), and a tprobe's record names its probe stub
// where it printed `(0x00000000)`.
#[test]
fn listings_and_tprobe_lines_match_the_kernel() {
    let t = Scope::new("dyn-golden");
    for def in [
        "f:golden/rd vfs_read count=$arg3:u64",
        "f:golden/rd_ret vfs_read%return ret=$retval:s64",
        "t dyn_sched_switch preempt=$arg1 next_pid=+0($arg3):s32",
        "t:golden/sw dyn_sched_switch",
        "e:eprobes/high_prio dsched.waking pid=$pid:u32 comm=$comm:string if prio < 100",
        "e:golden/any dsched.waking",
    ] {
        append("dynamic_events", &format!("{def}\n")).unwrap();
    }
    assert_eq!(
        read("dynamic_events"),
        "f:golden/rd vfs_read count=$arg3:u64\n\
         f:golden/rd_ret vfs_read%return ret=$retval:s64\n\
         t:tracepoints/dyn_sched_switch dyn_sched_switch preempt=$arg1 next_pid=+0($arg3):s32\n\
         t:golden/sw dyn_sched_switch\n\
         e:eprobes/high_prio dsched.waking pid=$pid:u32 comm=$comm:string\n\
         e:golden/any dsched.waking\n"
    );
    // The unlisted filter still applies.
    write(&t.p("events/eprobes/high_prio/enable"), "1\n").unwrap();
    waking::trace("kworker", 12, 120);
    waking::trace("rcu_preempt", 16, 98);
    write(&t.p("events/eprobes/high_prio/enable"), "0\n").unwrap();
    let lines = t.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        text_of(&lines[0]),
        "high_prio: (dsched.waking) pid=16 comm=\"rcu_preempt\""
    );
    write(&t.p("trace"), "").unwrap();

    // The kernel: `sched_switch: (__probestub_sched_switch+0x4/0x10) preempt=0 ...`. Here
    // the tracepoint's raw-probe entry, `NAME::register_raw`, is the stub.
    write(&t.p("events/tracepoints/dyn_sched_switch/enable"), "1\n").unwrap();
    let (prev, next) = (Task { pid: 70, prio: 120 }, Task { pid: 16, prio: 98 });
    dyn_sched_switch::trace(false, &prev, &next);
    write(&t.p("events/tracepoints/dyn_sched_switch/enable"), "0\n").unwrap();
    let lines = t.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let text = text_of(&lines[0]);
    let stub = "dyn_sched_switch: (dynevent::dyn_sched_switch::register_raw+0x0/0x";
    assert!(text.starts_with(stub), "{text}");
    assert!(text.ends_with(") preempt=0x0 next_pid=16"), "{text}");
    // The `ip` field holds the stub's address, for filters and raw readers.
    let format = read("events/tracepoints/dyn_sched_switch/format");
    assert!(format.contains("REC->__probe_ip"), "{format}");
}

// Issue 15 item 12, without debug files: a stripped library's `.dynsym` names carry no
// version (it is in `.gnu.version`), so both versions of a function were one name. They are
// spelled as a `.symtab` spells them, so `name@VERSION` works there too.
#[test]
fn versions_of_a_stripped_library_are_spelled_out() {
    let _t = Scope::new("dyn-stripped-versions");
    let dir = std::env::temp_dir().join(format!("ustrace-dynver-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, map, lib) = (
        dir.join("v.c"),
        dir.join("v.map"),
        dir.join("libustrace_dynver.so"),
    );
    std::fs::write(
        &src,
        "int vfn_old(int x) { return x + 1; }\n\
         int vfn_new(int x) { return x * 3 + 2; }\n\
         __asm__(\".symver vfn_old,ustrace_vfn@V1\");\n\
         __asm__(\".symver vfn_new,ustrace_vfn@@V2\");\n\
         int ustrace_vplain(int x) { return x; }\n",
    )
    .unwrap();
    std::fs::write(
        &map,
        "V1 { global: ustrace_vfn; ustrace_vplain; local: *; };\nV2 { global: ustrace_vfn; } V1;\n",
    )
    .unwrap();
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O0", "-s"])
        .arg(format!("-Wl,--version-script={}", map.display()))
        .arg("-o")
        .arg(&lib)
        .arg(&src)
        .status();
    if !status.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot build a shared library with cc");
        return;
    }
    let path = std::ffi::CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: loading a library just built from the source above (no constructors).
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    assert!(!handle.is_null());
    // SAFETY: valid handle, NUL-terminated names.
    let (v1, v2) = unsafe {
        (
            libc::dlvsym(handle, c"ustrace_vfn".as_ptr(), c"V1".as_ptr()) as usize,
            libc::dlvsym(handle, c"ustrace_vfn".as_ptr(), c"V2".as_ptr()) as usize,
        )
    };
    assert!(v1 != 0 && v2 != 0 && v1 != v2);
    let listed = listed_in("libustrace_dynver.so");
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["ustrace_vfn@@V2", "ustrace_vfn@V1", "ustrace_vplain"],
        "{listed:?}"
    );
    let inventory = ustrace_inspect::symbols::inventory();
    let addrs =
        |spec: &str| -> Vec<usize> { inventory.find(spec).iter().map(|s| s.addr).collect() };
    assert_eq!(addrs("ustrace_vfn"), [v2]);
    assert_eq!(addrs("ustrace_vfn@V1"), [v1]);
    assert_eq!(addrs("ustrace_vfn@V2"), [v2]);
    append("dynamic_events", "f:ver/old ustrace_vfn@V1\n").unwrap();
    append("dynamic_events", "f:ver/new ustrace_vfn\n").unwrap();
    let _ = write("dynamic_events", "");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A second probe point for the append test, with `vfs_read`'s shape.
#[no_mangle]
#[inline(never)]
pub extern "C" fn vfs_readv(file: *mut File, buf: *mut u8, count: usize, pos: *mut i64) -> isize {
    std::hint::black_box((file, buf, pos));
    count as isize + 1
}

// fprobetrace.rst and the kernel's fprobe_syntax_errors.tc ("Create/append/" in README):
// a line naming an existing `f` event adds a probe to it, if direction, kind and arguments
// agree, with the kernel's errors (append_trace_fprobe) where they do not.
#[test]
fn probes_append_to_an_existing_event() {
    let t = Scope::new("dyn-append");
    let _ = write("error_log", "");
    append("dynamic_events", "f:grp/rd vfs_read n=$arg3\n").unwrap();
    let rejected = |command: &str, message: &str, caret: usize| {
        assert_eq!(
            append("dynamic_events", &format!("{command}\n")),
            Err(Errno::EEXIST),
            "{command}"
        );
        assert_eq!(
            last_error(),
            format!(
                "trace_fprobe: error: {message}\n  Command: {command}\n{}^\n",
                " ".repeat("  Command: ".len() + caret)
            ),
            "{command}"
        );
    };
    // Checked before the symbol: do_exit is no function of this process.
    rejected(
        "f:grp/rd do_exit%return",
        "Probe type is different from existing probe",
        0,
    );
    rejected(
        "t:grp/rd dyn_sched_switch",
        "Probe type is different from existing probe",
        0,
    );
    let diff = "Argument type or name is different from existing probe";
    // The caret is under the first argument that differs (after the last word when one
    // list is longer).
    rejected("f:grp/rd vfs_readv m=$arg3", diff, 19);
    rejected("f:grp/rd vfs_readv n=$arg3:u8", diff, 19);
    rejected("f:grp/rd vfs_readv n=$arg3 m=$arg1", diff, 27);
    rejected("f:grp/rd vfs_readv", diff, 19);
    rejected(
        "f:grp/rd vfs_read n=$arg3",
        "There is already the exact same probe event",
        0,
    );
    // A static event's name is taken by another kind of event.
    rejected(
        "f:dsched/waking vfs_read",
        "Given group/event name is already used by another event",
        0,
    );
    assert_eq!(read("dynamic_events"), "f:grp/rd vfs_read n=$arg3\n");

    // The same function with other fetches is another probe; so is another function.
    append("dynamic_events", "f:grp/rd vfs_read n=$arg2\n").unwrap();
    write(&t.p("events/grp/rd/enable"), "1\n").unwrap();
    // Appended while enabled: it fires at once.
    append("dynamic_events", "f:grp/rd vfs_readv n=$arg3\n").unwrap();
    assert_eq!(
        read("dynamic_events"),
        "f:grp/rd vfs_read n=$arg3\nf:grp/rd vfs_read n=$arg2\nf:grp/rd vfs_readv n=$arg3\n"
    );
    let mut file = File {
        f_mode: 0,
        f_inode: 0,
    };
    let mut pos = 0i64;
    let buf = 0x1234 as *mut u8;
    vfs_read(&mut file, buf, 7, &mut pos);
    vfs_readv(&mut file, buf, 9, &mut pos);
    let lines: Vec<String> = t.lines().iter().map(|l| text_of(l).to_string()).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[..2].iter().any(|l| l.ends_with(" n=0x7")),
        "{lines:?}"
    );
    assert!(
        lines[..2].iter().any(|l| l.ends_with(" n=0x1234")),
        "{lines:?}"
    );
    assert!(
        lines[2].starts_with("rd: (vfs_readv+0x") && lines[2].ends_with(" n=0x9"),
        "{lines:?}"
    );

    // One probe of several goes even while the event is enabled; the last one may not.
    append("dynamic_events", "-:grp/rd vfs_read n=$arg2\n").unwrap();
    append("dynamic_events", "-:grp/rd vfs_readv\n").unwrap();
    assert_eq!(read("dynamic_events"), "f:grp/rd vfs_read n=$arg3\n");
    write(&t.p("trace"), "").unwrap();
    vfs_read(&mut file, buf, 5, &mut pos);
    vfs_readv(&mut file, buf, 6, &mut pos);
    let lines: Vec<String> = t.lines().iter().map(|l| text_of(l).to_string()).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].ends_with(" n=0x5"), "{lines:?}");
    assert_eq!(append("dynamic_events", "-:grp/rd\n"), Err(Errno::EBUSY));
    write(&t.p("events/grp/rd/enable"), "0\n").unwrap();
    append("dynamic_events", "-:grp/rd\n").unwrap();
    assert_eq!(read("dynamic_events"), "");
}

/// A function of six integer arguments, probed by the register-only and general events below.
#[no_mangle]
#[inline(never)]
pub extern "C" fn fastpath_target(a: u64, b: u32, c: i16, d: u64, e: u64, f: u8) -> u64 {
    std::hint::black_box((b, c, d, e, f));
    a
}

/// Arms the soft-disabled event of `register_only_events_record_what_the_general_path_does`.
#[no_mangle]
#[inline(never)]
pub extern "C" fn fastpath_arm(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(3)
}

/// An entry probe whose arguments are only registers and constants records through a plan
/// worked out at attach time (one of whole words only, through a handler whose record length
/// is a constant); one that also fetches `$comm` goes through the fetch program.
/// On the same calls both record the same values, and the fast one keeps every check of the
/// record path: soft-disabled by an `enable_event` trigger until armed, then filtered.
#[test]
fn register_only_events_record_what_the_general_path_does() {
    let t = Scope::new("dyn-fastpath");
    let args = "a=$arg1:u64 b=$arg2:u32 c=$arg3:s16 d=$arg4:x64 e=$arg5:x8 f=$arg6:u8 k=\\7:s32";
    append(
        "dynamic_events",
        &format!(
            "f:fastpath/fast fastpath_target {args}\n\
             f:fastpath/slow fastpath_target {args} comm=$comm\n\
             f:fastpath/words fastpath_target a=$arg1:u64 d=$arg4\n\
             f:fastpath/arm fastpath_arm\n"
        ),
    )
    .unwrap_or_else(|e| panic!("{e:?}: {}", read("error_log")));
    write(&t.p("events/fastpath/slow/enable"), "1\n").unwrap();
    write(&t.p("events/fastpath/words/enable"), "1\n").unwrap();
    // The trigger holds `fast` attached but soft-disabled until `arm` fires.
    write(
        &t.p("events/fastpath/arm/trigger"),
        "enable_event:fastpath:fast\n",
    )
    .unwrap();
    let call = |a: u64| fastpath_target(a, 0xdead_beef, -3, 0x1234_5678_9abc, 0x1ff, 200);
    call(1);
    fastpath_arm(1);
    call(2);
    write(&t.p("events/fastpath/fast/filter"), "a == 4\n").unwrap();
    call(3);
    call(4);
    let lines = t.lines();
    let events: Vec<(&str, &str)> = lines
        .iter()
        .filter_map(|l| text_of(l).split_once(": "))
        .collect();
    let fast: Vec<&str> = events
        .iter()
        .filter(|(e, _)| *e == "fast")
        .map(|(_, t)| *t)
        .collect();
    let slow: Vec<&str> = events
        .iter()
        .filter(|(e, _)| *e == "slow")
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(slow.len(), 4, "{lines:#?}");
    // Whole words only, in argument order: a handler whose record length is a constant.
    let words: Vec<&str> = events
        .iter()
        .filter(|(e, _)| *e == "words")
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(words.len(), 4, "{lines:#?}");
    for (w, s) in words.iter().zip(&slow) {
        let a = s.split(' ').find(|f| f.starts_with("a=")).expect("a");
        let probe = s.split(' ').next().expect("probe ip");
        assert_eq!(*w, format!("{probe} {a} d=0x123456789abc"), "{lines:#?}");
    }
    assert_eq!(fast.len(), 2, "soft-disabled, then filtered: {lines:#?}");
    for (f, a) in fast.iter().zip([2, 4]) {
        let want = format!(
            "(fastpath_target+0x0/0x{}) a={a} b=3735928559 c=-3 d=0x123456789abc e=0xff f=200 k=7",
            f.split_once("/0x")
                .and_then(|(_, r)| r.split_once(')'))
                .map_or("", |(size, _)| size)
        );
        assert_eq!(*f, want, "{lines:#?}");
        let general = slow
            .iter()
            .find(|s| s.contains(&format!(" a={a} ")))
            .unwrap_or_else(|| panic!("no general record of a={a}: {lines:#?}"));
        let (head, comm) = general.split_once(" comm=").expect("comm");
        assert_eq!(head, *f, "{lines:#?}");
        assert!(comm.starts_with('"'), "{general}");
    }
    write(
        &t.p("events/fastpath/arm/trigger"),
        "!enable_event:fastpath:fast\n",
    )
    .unwrap();
}
