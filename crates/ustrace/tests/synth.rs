//! Synthetic events (histogram.rst 2.2, events.rst 7.1–7.2): defined through
//! `synthetic_events`, `dynamic_events` and the Rust API; their `format`, their trace
//! lines, the kernel's errors with carets, `EBUSY` while in use; and filters, triggers and
//! eprobes on them as on any event.
//!
//! Every test takes `SERIAL`: a truncating write of `synthetic_events` removes every
//! synthetic event of the process. Each records into an instance of its own.

mod common;

use common::{append, body_lines, read, write};
use ustrace::synth::{self, SynthError, SynthEventCmd, SynthValue};
use ustrace::Errno;

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// An instance of its own, removed (with its events off) on drop.
struct Instance(&'static str);

impl Instance {
    fn new(name: &'static str) -> Instance {
        let _ = ustrace::trace::tracing().remove_instance(name);
        ustrace::trace::tracing().create_instance(name).unwrap();
        Instance(name)
    }
    fn path(&self, file: &str) -> String {
        format!("instances/{}/{file}", self.0)
    }
    fn lines(&self) -> Vec<String> {
        body_lines(&read(&self.path("trace")).unwrap())
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = write(&self.path("events/enable"), "0");
        let _ = ustrace::trace::tracing().remove_instance(self.0);
    }
}

/// The text after the line context (`name: ...`).
fn texts(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            l.split_once(": ")
                .map_or(l.as_str(), |(_, t)| t)
                .to_string()
        })
        .collect()
}

/// The newest `error_log` entry, without its timestamp.
fn last_error() -> String {
    let log = read("error_log").unwrap();
    let start = log.rfind("\n[").map(|i| i + 1).unwrap_or(0);
    let entry = &log[start..];
    entry
        .split_once("] ")
        .map(|(_, rest)| rest.to_string())
        .unwrap_or_default()
}

#[test]
fn defined_through_the_file_with_the_kernels_format_and_listing() {
    let _s = serial();
    write(
        "synthetic_events",
        "wakeup_lat u64 lat; pid_t pid; char comm[16]; char name[]; unsigned long[] stack\n",
    )
    .unwrap();
    assert_eq!(
        read("synthetic_events").unwrap(),
        "wakeup_lat\tu64 lat; pid_t pid; char[16] comm; char[] name; unsigned long[] stack\n"
    );
    for file in ["enable", "filter", "trigger", "format", "id"] {
        read(&format!("events/synthetic/wakeup_lat/{file}")).unwrap();
    }
    assert!(read("available_events")
        .unwrap()
        .contains("synthetic:wakeup_lat\n"));
    let id = read("events/synthetic/wakeup_lat/id").unwrap();
    let expected = format!(
        "name: wakeup_lat\n\
         ID: {}\n\
         format:\n\
         \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
         \tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
         \tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
         \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\
         \n\
         \tfield:u64 lat;\toffset:8;\tsize:8;\tsigned:0;\n\
         \tfield:pid_t pid;\toffset:16;\tsize:4;\tsigned:1;\n\
         \tfield:char comm[16];\toffset:24;\tsize:16;\tsigned:1;\n\
         \tfield:__data_loc char[] name;\toffset:280;\tsize:8;\tsigned:1;\n\
         \tfield:__data_loc unsigned long[] stack;\toffset:288;\tsize:8;\tsigned:1;\n\
         \n\
         print fmt: \"lat=%llu, pid=%d, comm=%.*s, name=%.*s, stack=%s\", REC->lat, \
         REC->pid, REC->comm, __get_str(name), __get_stacktrace(stack)\n",
        id.trim()
    );
    assert_eq!(
        read("events/synthetic/wakeup_lat/format").unwrap(),
        expected
    );

    // `>>` appends; `!name` removes; `>` removes all first.
    append("synthetic_events", "second s32 x\n").unwrap();
    assert_eq!(read("synthetic_events").unwrap().lines().count(), 2);
    append("synthetic_events", "!wakeup_lat\n").unwrap();
    assert_eq!(read("synthetic_events").unwrap(), "second\ts32 x\n");
    assert!(read("events/synthetic/wakeup_lat/format").is_err());
    write("synthetic_events", "third u8 y").unwrap();
    assert_eq!(read("synthetic_events").unwrap(), "third\tu8 y\n");
    write("synthetic_events", "").unwrap();
    assert_eq!(read("synthetic_events").unwrap(), "");
    assert_eq!(
        append("synthetic_events", "!third"),
        Err(Errno::ENOENT),
        "removing what is not there"
    );
}

#[test]
fn recorded_from_the_api_and_printed_as_the_kernel_prints() {
    let _s = serial();
    let inst = Instance::new("synth_rec");
    let event = synth::create(
        "rec_lat",
        &[
            ("u64", "lat"),
            ("pid_t", "pid"),
            ("char[16]", "comm"),
            ("char[]", "name"),
            ("s8", "small"),
            ("bool", "flag"),
        ],
    )
    .unwrap();
    let values = |lat: u64| {
        [
            SynthValue::U64(lat),
            SynthValue::from(-7i32),
            "worker".into(),
            "a/dynamic/name".into(),
            (-1i8).into(),
            true.into(),
        ]
    };
    event.trace(&values(1)).unwrap(); // off: nothing recorded
    write(&inst.path("events/synthetic/rec_lat/enable"), "1").unwrap();
    assert!(event.is_enabled());
    event.trace(&values(2)).unwrap();
    // piecewise, by name and in order
    let mut t = event.trace_start();
    t.add_val("name", "by-name").unwrap();
    t.add_val("lat", 3u64).unwrap();
    t.end().unwrap();
    let mut t = event.trace_start();
    for v in values(4) {
        t.add_next_val(v).unwrap();
    }
    t.end().unwrap();
    write(&inst.path("events/synthetic/rec_lat/enable"), "0").unwrap();
    event.trace(&values(5)).unwrap();
    assert_eq!(
        texts(&inst.lines()),
        [
            "rec_lat: lat=2 pid=-7 comm=worker name=a/dynamic/name small=255 flag=1",
            "rec_lat: lat=3 pid=0 comm= name=by-name small=0 flag=0",
            "rec_lat: lat=4 pid=-7 comm=worker name=a/dynamic/name small=255 flag=1",
        ]
    );
    // The `verbose` option shows each value's conversion, as the kernel's.
    write(&inst.path("options/verbose"), "1").unwrap();
    assert_eq!(
        texts(&inst.lines())[0],
        "rec_lat: %llu lat=2 %d pid=-7 %.*s comm=worker %.*s name=a/dynamic/name %d small=255 \
         %d flag=1"
    );
    drop(inst);
    synth::delete("rec_lat").unwrap();
}

#[test]
fn api_mistakes_are_errors() {
    let _s = serial();
    let event = SynthEventCmd::start_with("api_err", &[("u64", "a"), ("char[]", "s")])
        .unwrap()
        .end()
        .unwrap();
    assert_eq!(
        event.trace(&[SynthValue::U64(1)]),
        Err(SynthError::WrongCount {
            expected: 2,
            got: 1
        })
    );
    assert_eq!(
        event.trace(&["x".into(), "y".into()]),
        Err(SynthError::WrongType {
            field: 0,
            expected: "an integer"
        })
    );
    let mut t = event.trace_start();
    assert_eq!(t.add_val("nope", 1u64), Err(SynthError::NoSuchField));
    assert_eq!(t.add_next_val(1u64), Err(SynthError::MixedAdd));
    let mut t = event.trace_start();
    t.add_next_val(1u64).unwrap();
    assert_eq!(
        t.add_next_val(2u64),
        Err(SynthError::WrongType {
            field: 1,
            expected: "a string"
        })
    );
    t.add_next_val("ok").unwrap();
    assert_eq!(t.add_next_val(3u64), Err(SynthError::TooManyValues));
    assert_eq!(t.add_val("a", 1u64), Err(SynthError::MixedAdd));
    assert_eq!(
        synth::create("api_err", &[("u64", "a")])
            .unwrap_err()
            .errno(),
        Errno::EEXIST
    );
    assert_eq!(
        synth::create("api_bad", &[("u65", "a")]).err(),
        Some(SynthError::InvalidType("u65".into()))
    );
    let mut cmd = SynthEventCmd::start("api_bad");
    cmd.add_field_str("chr x").unwrap();
    let err = cmd.end().unwrap_err();
    assert_eq!(err.errno(), Errno::EINVAL);
    assert_eq!(
        last_error(),
        format!(
            "synthetic_events: error: Invalid type\n  Command: api_bad chr x;\n{}^\n",
            " ".repeat("  Command: api_bad ".len())
        )
    );
    assert_eq!(synth::delete("api_none"), Err(SynthError::NotFound));
    synth::delete("api_err").unwrap();
    assert_eq!(
        event.trace(&[1u64.into(), "s".into()]),
        Err(SynthError::NotFound)
    );
}

/// trigger-synthetic_event_syntax_errors.tc: each command fails with EINVAL and the
/// caret where the selftest puts it.
#[test]
fn the_selftests_errors_and_carets() {
    let _s = serial();
    let cases = [
        ("myevent ^chr arg", "Invalid type"),
        ("myevent ^unsigned arg", "Incomplete type"),
        ("myevent char ^str]; int v", "Illegal name"),
        ("^mye-vent char str[]", "Illegal name"),
        ("myevent char ^st-r[]", "Illegal name"),
        ("myevent char str;^[]", "Invalid field"),
        ("myevent char str; ^int", "Invalid field"),
        ("myevent char ^str[; int v", "Invalid array specification"),
        ("myevent char ^str[kdjdk]", "Invalid array specification"),
        ("myevent char ^str[257]", "Invalid array specification"),
        (
            "^mye;vent char str[]",
            "Command must be of the form: <name> field[;field] ...",
        ),
        (
            "^myevent ; char str[]",
            "Command must be of the form: <name> field[;field] ...",
        ),
        (
            "^myevent",
            "Command must be of the form: <name> field[;field] ...",
        ),
    ];
    for (marked, message) in cases {
        let pos = marked.find('^').unwrap();
        let command = marked.replacen('^', "", 1);
        assert_eq!(
            append("synthetic_events", &format!("{command}\n")),
            Err(Errno::EINVAL),
            "{command}"
        );
        assert_eq!(
            last_error(),
            format!(
                "synthetic_events: error: {message}\n  Command: {command}\n{}^\n",
                " ".repeat(pos + 11)
            )
        );
    }
    assert_eq!(
        append("dynamic_events", "s:junk/myevent char str[\n"),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        last_error(),
        "synthetic_events: error: Command must be of the form: s or -:[synthetic/]<name> \
         field[;field] ...\n  Command: s:junk/myevent char str[\n           ^\n"
    );
    append("synthetic_events", "dup u64 a\n").unwrap();
    assert_eq!(
        append("synthetic_events", "dup u64 b\n"),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        last_error(),
        "synthetic_events: error: Event already exists\n  Command: dup u64 b\n           ^\n"
    );
    append("synthetic_events", "!dup\n").unwrap();
    assert_eq!(read("synthetic_events").unwrap(), "");
}

/// dynevent/add_remove_synth.tc, and the listing beside probe events.
#[test]
fn s_lines_in_dynamic_events() {
    let _s = serial();
    write("dynamic_events", "").unwrap();
    append("dynamic_events", "s:latency1 u64 lat; pid_t pid;\n").unwrap();
    append(
        "dynamic_events",
        "s:synthetic/latency2 u64 lat; pid_t pid;\n",
    )
    .unwrap();
    assert_eq!(
        read("dynamic_events").unwrap(),
        "s:synthetic/latency1\tu64 lat; pid_t pid\ns:synthetic/latency2\tu64 lat; pid_t pid\n"
    );
    assert_eq!(
        read("synthetic_events").unwrap(),
        "latency1\tu64 lat; pid_t pid\nlatency2\tu64 lat; pid_t pid\n"
    );
    read("events/synthetic/latency1/enable").unwrap();
    append("dynamic_events", "-:synthetic/latency2\n").unwrap();
    assert_eq!(
        read("dynamic_events").unwrap(),
        "s:synthetic/latency1\tu64 lat; pid_t pid\n"
    );
    assert_eq!(
        append("dynamic_events", "-:synthetic/latency2\n"),
        Err(Errno::ENOENT)
    );
    append("dynamic_events", "-:latency1\n").unwrap();
    append("dynamic_events", "s:latency3 u64 lat\n").unwrap();
    write("dynamic_events", "").unwrap();
    assert_eq!(read("dynamic_events").unwrap(), "");
    assert_eq!(read("synthetic_events").unwrap(), "");
}

#[test]
fn in_use_events_cannot_be_removed() {
    let _s = serial();
    let inst = Instance::new("synth_busy");
    append("synthetic_events", "busy_a u64 a\n").unwrap();
    append("dynamic_events", "s:busy_b u64 b\n").unwrap();
    write(&inst.path("events/synthetic/busy_a/enable"), "1").unwrap();
    for attempt in [
        append("synthetic_events", "!busy_a\n"),
        write("synthetic_events", ""),
        write("dynamic_events", ""),
        append("dynamic_events", "-:synthetic/busy_a\n"),
    ] {
        assert_eq!(attempt, Err(Errno::EBUSY));
    }
    // Nothing was lost on the way.
    assert_eq!(
        read("synthetic_events").unwrap(),
        "busy_a\tu64 a\nbusy_b\tu64 b\n"
    );
    write(&inst.path("events/synthetic/busy_a/enable"), "0").unwrap();

    // A trigger holds the event too (soft mode), and so does a hold.
    write(&inst.path("events/synthetic/busy_a/trigger"), "traceoff").unwrap();
    assert_eq!(append("synthetic_events", "!busy_a\n"), Err(Errno::EBUSY));
    write(&inst.path("events/synthetic/busy_a/trigger"), "!traceoff").unwrap();
    let hold = synth::find("busy_b").unwrap().hold();
    assert_eq!(synth::delete("busy_b"), Err(SynthError::Busy));
    drop(hold);
    synth::delete("busy_b").unwrap();
    append("synthetic_events", "!busy_a\n").unwrap();
    assert_eq!(read("synthetic_events").unwrap(), "");
}

#[test]
fn filters_triggers_and_eprobes_work_on_them() {
    let _s = serial();
    let inst = Instance::new("synth_stages");
    append("synthetic_events", "stage_lat u64 lat; char op[]\n").unwrap();
    let event = synth::find("stage_lat").unwrap();
    let dir = inst.path("events/synthetic/stage_lat");
    write(&format!("{dir}/filter"), "lat > 100 && op == \"get\"").unwrap();
    write(&format!("{dir}/enable"), "1").unwrap();
    for (lat, op) in [(50u64, "get"), (150, "get"), (200, "put"), (300, "get")] {
        event.trace(&[lat.into(), op.into()]).unwrap();
    }
    assert_eq!(
        texts(&inst.lines()),
        ["stage_lat: lat=150 op=get", "stage_lat: lat=300 op=get"]
    );
    write(&format!("{dir}/filter"), "0").unwrap();
    write(&inst.path("trace"), "").unwrap();

    // An eprobe reads its fields.
    append(
        "dynamic_events",
        "e:synth_ep/on_lat synthetic.stage_lat l=$lat op=$op:string\n",
    )
    .unwrap();
    // dynamic_events lists every kind in creation order.
    let listed = read("dynamic_events").unwrap();
    let heads: Vec<&str> = listed
        .lines()
        .map(|l| l.split([' ', '\t']).next().unwrap())
        .collect();
    assert_eq!(
        heads,
        ["s:synthetic/stage_lat", "e:synth_ep/on_lat"],
        "{listed}"
    );
    write(&inst.path("events/synth_ep/on_lat/enable"), "1").unwrap();
    event.trace(&[7u64.into(), "eprobed".into()]).unwrap();
    write(&inst.path("events/synth_ep/on_lat/enable"), "0").unwrap();
    assert_eq!(
        texts(&inst.lines()),
        // The kernel reserves the source record in the ring buffer, then runs the eprobe
        // (a trigger) before committing it: the source comes first.
        [
            "stage_lat: lat=7 op=eprobed",
            "on_lat: (synthetic.stage_lat) l=0x7 op=\"eprobed\"",
        ]
    );
    // The synthetic event is the eprobe's source: busy until the eprobe goes.
    assert_eq!(
        append("synthetic_events", "!stage_lat\n"),
        Err(Errno::EBUSY)
    );
    append("dynamic_events", "-:synth_ep/on_lat\n").unwrap();

    // A trigger fires on it.
    write(&format!("{dir}/trigger"), "traceoff if lat > 1000").unwrap();
    event.trace(&[5u64.into(), "a".into()]).unwrap();
    assert_eq!(read(&inst.path("tracing_on")).unwrap(), "1\n");
    event.trace(&[5000u64.into(), "b".into()]).unwrap();
    assert_eq!(read(&inst.path("tracing_on")).unwrap(), "0\n");
    write(&format!("{dir}/trigger"), "!traceoff").unwrap();
    write(&format!("{dir}/enable"), "0").unwrap();
    drop(inst);
    append("synthetic_events", "!stage_lat\n").unwrap();
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn synth_test_caller() -> u64 {
    std::hint::black_box(1)
}

#[test]
fn stack_fields_print_one_symbol_a_line() {
    let _s = serial();
    let inst = Instance::new("synth_stack");
    append("synthetic_events", "stk pid_t pid; unsigned long[] stack\n").unwrap();
    let event = synth::find("stk").unwrap();
    write(&inst.path("events/synthetic/stk/enable"), "1").unwrap();
    let addr = synth_test_caller as *const () as usize as u64;
    event
        .trace(&[1i32.into(), SynthValue::Stack(&[addr + 1, addr, 0, 99])])
        .unwrap();
    let trace = read(&inst.path("trace")).unwrap();
    let body: Vec<&str> = trace.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(body[0].ends_with("stk: pid=1 stack=STACK:"), "{trace}");
    assert!(
        body[1].starts_with("=> synth_test_caller+0x1/0x"),
        "{trace}"
    );
    assert!(
        body[2].starts_with("=> synth_test_caller+0x0/0x"),
        "{trace}"
    );
    assert_eq!(
        body.len(),
        4,
        "the kernel ends the line after the stack: {trace}"
    );
    write(&inst.path("events/synthetic/stk/enable"), "0").unwrap();
    drop(inst);
    synth::delete("stk").unwrap();
}

/// events.rst 7.2: a file of one instance (`trace_get_event_file`) records there alone and
/// holds the event; `Synthetic::trace` records into every instance that has it on.
#[test]
fn one_instance_through_its_file() {
    let _s = serial();
    let a = Instance::new("synth_file_a");
    let b = Instance::new("synth_file_b");
    let event = synth::create("file_ev", &[("u32", "n")]).unwrap();
    let fa = event.file(Some("synth_file_a")).unwrap();
    let fb = event.file(Some("synth_file_b")).unwrap();
    assert_eq!(
        event.file(Some("synth_file_none")).err(),
        Some(SynthError::NotFound)
    );
    fa.trace(&[1u32.into()]).unwrap(); // off there: nothing
    fa.set_enabled(true).unwrap();
    fb.set_enabled(true).unwrap();
    fa.trace(&[2u32.into()]).unwrap();
    let mut t = fb.trace_start();
    t.add_val("n", 3u32).unwrap();
    t.end().unwrap();
    event.trace(&[4u32.into()]).unwrap();
    assert_eq!(texts(&a.lines()), ["file_ev: n=2", "file_ev: n=4"]);
    assert_eq!(texts(&b.lines()), ["file_ev: n=3", "file_ev: n=4"]);
    fa.set_enabled(false).unwrap();
    fb.set_enabled(false).unwrap();
    assert_eq!(synth::delete("file_ev"), Err(SynthError::Busy));
    drop((fa, fb));
    drop((a, b));
    synth::delete("file_ev").unwrap();
}

/// A hist trigger on a synthetic event, keyed on a dynamic string, summing a field (the
/// selftests' `hist:keys=filename,lat` on `synthetic/ping_test_latency`). Needs the hist
/// triggers of the hist-core branch: skipped without them.
#[test]
fn a_hist_on_a_synthetic_event() {
    let _s = serial();
    let inst = Instance::new("synth_hist");
    append("synthetic_events", "hist_lat u64 lat; char op[]\n").unwrap();
    let dir = inst.path("events/synthetic/hist_lat");
    if read(&format!("{dir}/hist")).is_err() {
        eprintln!("skipped: this build has no hist triggers");
        drop(inst);
        append("synthetic_events", "!hist_lat\n").unwrap();
        return;
    }
    write(&format!("{dir}/trigger"), "hist:keys=op:vals=lat:sort=op").unwrap();
    let event = synth::find("hist_lat").unwrap();
    for (lat, op) in [(10u64, "get"), (20, "get"), (5, "put")] {
        event.trace(&[lat.into(), op.into()]).unwrap();
    }
    let hist = read(&format!("{dir}/hist")).unwrap();
    let entries: Vec<Vec<&str>> = hist
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        entries,
        [
            ["{", "op:", "get", "}", "hitcount:", "2", "lat:", "30"],
            ["{", "op:", "put", "}", "hitcount:", "1", "lat:", "5"],
        ],
        "{hist}"
    );
    assert!(hist.contains("    Hits: 3\n"), "{hist}");
    // The hist trigger holds the event.
    assert_eq!(append("synthetic_events", "!hist_lat\n"), Err(Errno::EBUSY));
    write(&format!("{dir}/trigger"), "!hist:keys=op:vals=lat:sort=op").unwrap();
    drop(inst);
    append("synthetic_events", "!hist_lat\n").unwrap();
}

/// More threads than cores record one event while other synthetic events come and go and
/// the event is turned on and off in a second instance: every record written while on
/// in the first instance is there, once.
#[test]
fn concurrent_writers_lose_nothing() {
    let _s = serial();
    let inst = Instance::new("synth_stress");
    let other = Instance::new("synth_stress_other");
    write(&inst.path("buffer_size_kb"), "4096").unwrap();
    let event = synth::create(
        "stress_ev",
        &[("u32", "thread"), ("u64", "n"), ("char[]", "s")],
    )
    .unwrap();
    write(&inst.path("events/synthetic/stress_ev/enable"), "1").unwrap();
    const THREADS: u32 = 6;
    const EACH: u64 = 3000;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..THREADS)
            .map(|t| {
                let event = &event;
                s.spawn(move || {
                    for n in 0..EACH {
                        if n.is_multiple_of(2) {
                            event.trace(&[t.into(), n.into(), "x".into()]).unwrap();
                        } else {
                            let mut p = event.trace_start();
                            p.add_next_val(t).unwrap();
                            p.add_next_val(n).unwrap();
                            p.add_next_val("y").unwrap();
                            p.end().unwrap();
                        }
                    }
                })
            })
            .collect();
        s.spawn(|| {
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = format!("stress_tmp{}", i % 4);
                append("synthetic_events", &format!("{name} u64 v\n")).unwrap();
                let on = if i.is_multiple_of(2) { "1" } else { "0" };
                write(&other.path("events/synthetic/stress_ev/enable"), on).unwrap();
                append("synthetic_events", &format!("!{name}\n")).unwrap();
                i += 1;
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    write(&inst.path("events/synthetic/stress_ev/enable"), "0").unwrap();
    let mut seen = std::collections::HashSet::new();
    for line in texts(&inst.lines()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[0], "stress_ev:", "{line}");
        assert!(
            seen.insert((fields[1].to_string(), fields[2].to_string())),
            "twice: {line}"
        );
    }
    assert_eq!(seen.len() as u64, u64::from(THREADS) * EACH);
    drop((inst, other));
    synth::delete("stress_ev").unwrap();
}
