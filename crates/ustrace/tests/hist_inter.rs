//! histogram.rst 2.2 (inter-event hist triggers) and eprobetrace.rst Examples 2 and 3,
//! example by example, on user-space events shaped like the documents' kernel events:
//! variables and `$var` references across events, expressions, field variables, the
//! `onmatch`/`onmax`/`onchange` handlers with `trace`/`save`/`snapshot`, and the kernel's
//! error_log messages for each mistake.
//!
//! Latencies computed from `common_timestamp` are checked for plausibility only; exact
//! outputs come from events that carry their own time field (`tnet`), which drives the same
//! variable, expression and action machinery deterministically.

mod common;

use ustrace::{Errno, FileSystem};

ustrace::trace_event! {
    pub fn sched::sched_waking(comm: &str, pid: i32, prio: i32, target_cpu: i32) {
        comm: ustrace::FixedStr<16> = ustrace::FixedStr::new(comm),
        pid: i32 = pid,
        prio: i32 = prio,
        target_cpu: i32 = target_cpu,
    }
    print "comm=%s pid=%d prio=%d target_cpu=%03d", comm, pid, prio, target_cpu;
}

ustrace::trace_event! {
    pub fn sched::sched_wakeup(comm: &str, pid: i32, prio: i32, target_cpu: i32) {
        comm: ustrace::FixedStr<16> = ustrace::FixedStr::new(comm),
        pid: i32 = pid,
        prio: i32 = prio,
        target_cpu: i32 = target_cpu,
    }
    print "comm=%s pid=%d prio=%d target_cpu=%03d", comm, pid, prio, target_cpu;
}

#[path = "common/sched_switch.rs"]
mod sched_events;
use sched_events::sched_switch;

// A request/response pair that carries its own time (`t`), so latencies are exact.
ustrace::trace_event! {
    pub fn tnet::request(id: u64, op: &str, t: u64) {
        id: u64 = id,
        op: ustrace::FixedStr<16> = ustrace::FixedStr::new(op),
        t: u64 = t,
    }
    print "id=%llu op=%s t=%llu", id, op, t;
}

ustrace::trace_event! {
    pub fn tnet::respond(id: u64, t: u64, status: i32) {
        id: u64 = id,
        t: u64 = t,
        status: i32 = status,
    }
    print "id=%llu t=%llu status=%d", id, t, status;
}

// Shaped like raw_syscalls:sys_enter/sys_exit and syscalls:sys_{enter,exit}_openat.
ustrace::trace_event! {
    pub fn raw_syscalls::sys_enter(id: i64, args: [u64; 6]) {
        id: i64 = id,
        args: [u64; 6] = args,
    }
    print "NR %ld (%lx, %lx, %lx, %lx, %lx, %lx)", id, args[0], args[1], args[2], args[3], args[4], args[5];
}

ustrace::trace_event! {
    pub fn raw_syscalls::sys_exit(id: i64, ret: i64) {
        id: i64 = id,
        ret: i64 = ret,
    }
    print "NR %ld = %ld", id, ret;
}

ustrace::trace_event! {
    pub fn syscalls::sys_enter_openat(dfd: i64, filename: u64, flags: i64, mode: u64) {
        dfd: i64 = dfd,
        filename: u64 = filename,
        flags: i64 = flags,
        mode: u64 = mode,
    }
    print "dfd: 0x%08lx, filename: 0x%08lx, flags: 0x%08lx, mode: 0x%08lx", dfd, filename, flags, mode;
}

ustrace::trace_event! {
    pub fn syscalls::sys_exit_openat(ret: i64) {
        ret: i64 = ret,
    }
    print "0x%lx", ret;
}

/// Synthetic events are global, so tests that define them run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Instance(
    String,
    Vec<String>,
    #[allow(dead_code)] std::sync::MutexGuard<'static, ()>,
);

impl Instance {
    fn new(name: &str) -> Instance {
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let _ = ustrace::tracefs().rmdir(&format!("instances/{name}"));
        ustrace::tracefs()
            .mkdir(&format!("instances/{name}"))
            .unwrap();
        Instance(name.to_string(), Vec::new(), guard)
    }
    fn path(&self, p: &str) -> String {
        format!("instances/{}/{p}", self.0)
    }
    fn read(&self, p: &str) -> String {
        common::read(&self.path(p)).unwrap()
    }
    fn append(&self, p: &str, text: &str) -> Result<(), Errno> {
        common::append(&self.path(p), text)
    }
    fn write(&self, p: &str, text: &str) -> Result<(), Errno> {
        common::write(&self.path(p), text)
    }
    /// Defines a synthetic event (top level, as the kernel's `synthetic_events` is), to be
    /// removed when the test ends.
    fn synth(&mut self, def: &str) {
        common::append("synthetic_events", &format!("{def}\n")).unwrap();
        self.1
            .push(def.split_whitespace().next().unwrap().to_string());
    }
    /// The `{ ... } hitcount: ...` lines of a `hist` file, in order.
    fn entries(&self, event: &str) -> Vec<String> {
        self.read(&format!("events/{event}/hist"))
            .lines()
            .filter(|l| l.starts_with("{ "))
            .map(String::from)
            .collect()
    }
    /// The trigger info lines of a `hist` file.
    fn infos(&self, event: &str) -> Vec<String> {
        self.read(&format!("events/{event}/hist"))
            .lines()
            .filter_map(|l| l.strip_prefix("# trigger info: "))
            .map(String::from)
            .collect()
    }
    /// Asserts the error_log holds `message` for `command` on `location`, the caret under
    /// the first occurrence of `at` in the command (the kernel's `err_pos`), or under its
    /// start when `at` is empty.
    fn assert_logged(&self, location: &str, message: &str, command: &str, at: &str) {
        let log = self.read("error_log");
        let pos = if at.is_empty() {
            0
        } else {
            command.find(at).expect("caret text in command")
        };
        let want = format!(
            "{location}: error: {message}\n  Command: {command}\n{}^\n",
            " ".repeat(pos + "  Command: ".len())
        );
        assert!(log.contains(&want), "want:\n{want}\nin error_log:\n{log}");
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = ustrace::tracefs().rmdir(&format!("instances/{}", self.0));
        for name in self.1.drain(..).rev() {
            let _ = common::append("synthetic_events", &format!("!{name}\n"));
        }
    }
}

fn skip_without_hist() -> bool {
    if common::read("synthetic_events").is_err() {
        println!("skipped: no synthetic_events file");
        return true;
    }
    false
}

// histogram.rst 2.2.3, onmatch().trace(): a latency between two events matched by key,
// passed to a synthetic event whose own histogram aggregates it. Read-once references:
// a second response without a new request generates nothing; an unmatched key neither.
#[test]
fn onmatch_trace_generates_a_synthetic_event_per_matched_pair() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-onmatch");
    t.synth("req_lat u64 id; u64 lat");
    t.append("events/tnet/request/trigger", "hist:keys=id:t0=t\n")
        .unwrap();
    t.append(
        "events/tnet/respond/trigger",
        "hist:keys=id:lat=t-$t0:onmatch(tnet.request).trace(req_lat,id,$lat)\n",
    )
    .unwrap();
    t.append(
        "events/synthetic/req_lat/trigger",
        "hist:keys=id,lat:sort=id,lat\n",
    )
    .unwrap();

    request::trace(1, "get", 100);
    request::trace(2, "put", 150);
    respond::trace(1, 130, 200);
    respond::trace(2, 400, 200);
    respond::trace(1, 500, 200); // t0 of id 1 was consumed: no match
    respond::trace(3, 10, 200); // no request with id 3
    request::trace(1, "get", 1000);
    respond::trace(1, 1007, 200);

    assert_eq!(
        t.read("events/synthetic/req_lat/hist"),
        "# event histogram\n\
         #\n\
         # trigger info: hist:keys=id,lat:vals=hitcount:sort=id,lat:size=2048 [active]\n\
         #\n\
         \n\
         { id:          1, lat:          7 } hitcount:          1\n\
         { id:          1, lat:         30 } hitcount:          1\n\
         { id:          2, lat:        250 } hitcount:          1\n\
         \n\
         Totals:\n    Hits: 3\n    Entries: 3\n    Dropped: 0\n"
    );
    assert_eq!(
        t.infos("tnet/request"),
        ["hist:keys=id:vals=hitcount:t0=t:sort=hitcount:size=2048 [active]"]
    );
    assert_eq!(
        t.infos("tnet/respond"),
        ["hist:keys=id:vals=hitcount:lat=t-$t0:sort=hitcount:size=2048:onmatch(tnet.request).trace(req_lat,id,$lat) [active]"]
    );
    // Unresolved references skip the whole update, as the kernel's (sorted by hitcount).
    assert_eq!(
        t.entries("tnet/respond"),
        [
            "{ id:          2 } hitcount:          1",
            "{ id:          1 } hitcount:          2"
        ]
    );
    assert_eq!(
        t.read("events/tnet/respond/trigger"),
        "hist:keys=id:vals=hitcount:lat=t-$t0:sort=hitcount:size=2048:onmatch(tnet.request).trace(req_lat,id,$lat) [active]\n"
    );
}

// histogram.rst 2.2.3: the synthetic event name used as the action, and the event
// recorded in the trace when enabled.
#[test]
fn onmatch_synthetic_name_form_records_the_synthetic_event() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-synthname");
    t.synth("req_lat2 u64 id; u64 lat");
    t.append("events/tnet/request/trigger", "hist:keys=id:t0=t\n")
        .unwrap();
    t.append(
        "events/tnet/respond/trigger",
        "hist:keys=id:lat=t-$t0:onmatch(tnet.request).req_lat2(id,$lat)\n",
    )
    .unwrap();
    t.write("events/synthetic/req_lat2/enable", "1\n").unwrap();
    request::trace(7, "get", 10);
    respond::trace(7, 52, 200);
    let trace = t.read("trace");
    let lines = common::body_lines(&trace);
    assert_eq!(lines.len(), 1, "{trace}");
    assert!(
        lines[0].ends_with(": req_lat2: id=7 lat=42"),
        "{}",
        lines[0]
    );
    assert_eq!(
        t.infos("tnet/respond"),
        ["hist:keys=id:vals=hitcount:lat=t-$t0:sort=hitcount:size=2048:onmatch(tnet.request).req_lat2(id,$lat) [active]"]
    );
}

// histogram.rst 2.2.3, the wakeup_latency example: `keys=$saved_pid`, `.usecs`
// timestamps, a `$var` and an event field as synthetic parameters, filters on both sides.
#[test]
fn wakeup_latency_from_common_timestamps() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-wakeup");
    t.synth("wakeup_latency u64 lat; pid_t pid; int prio");
    t.append(
        "events/sched/sched_waking/trigger",
        "hist:keys=$saved_pid:saved_pid=pid:ts0=common_timestamp.usecs if comm==\"cyclictest\"\n",
    )
    .unwrap();
    t.append(
        "events/sched/sched_switch/trigger",
        "hist:keys=next_pid:wakeup_lat=common_timestamp.usecs-$ts0:onmatch(sched.sched_waking).wakeup_latency($wakeup_lat,$saved_pid,next_prio) if next_comm==\"cyclictest\"\n",
    )
    .unwrap();
    t.append(
        "events/synthetic/wakeup_latency/trigger",
        "hist:keys=pid,prio,lat:sort=pid,lat\n",
    )
    .unwrap();

    sched_waking::trace("cyclictest", 2035, 9, 1);
    sched_waking::trace("bash", 2036, 120, 1); // filtered out
    std::thread::sleep(std::time::Duration::from_millis(3));
    sched_switch::trace("swapper/1", 0, 120, 0, "bash", 2036, 120); // filtered out
    sched_switch::trace("swapper/1", 0, 120, 0, "cyclictest", 2035, 9);

    assert_eq!(
        t.infos("sched/sched_waking"),
        ["hist:keys=pid:vals=hitcount:saved_pid=pid,ts0=common_timestamp.usecs:sort=hitcount:size=2048:clock=global if comm==\"cyclictest\" [active]"]
    );
    assert_eq!(
        t.infos("sched/sched_switch"),
        ["hist:keys=next_pid:vals=hitcount:wakeup_lat=common_timestamp.usecs-$ts0:sort=hitcount:size=2048:clock=global:onmatch(sched.sched_waking).wakeup_latency($wakeup_lat,$saved_pid,next_prio) if next_comm==\"cyclictest\" [active]"]
    );
    let entries = t.entries("synthetic/wakeup_latency");
    assert_eq!(entries.len(), 1, "{entries:?}");
    let e = &entries[0];
    assert!(
        e.starts_with("{ pid:       2035, prio:          9, lat: "),
        "{e}"
    );
    let lat: u64 = e["{ pid:       2035, prio:          9, lat: ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (3000..5_000_000).contains(&lat),
        "latency {lat} us after a 3 ms sleep"
    );
}

// histogram.rst 2.2.1: expressions (+ - * /, constants, left to right), a constant in a
// variable referenced later, and the kernel's -1 for a division by a zero it could not see.
#[test]
fn expressions_are_evaluated_as_the_kernel_does() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-expr");
    t.synth("calc u64 a; u64 b; u64 c; u64 d; u64 e");
    t.append("events/tnet/request/trigger", "hist:keys=id:t0=t\n")
        .unwrap();
    t.append(
        "events/tnet/respond/trigger",
        "hist:keys=id:a=t*3+2,b=t/4,c=t-$t0,d=t-5-3-1,e=t/status:onmatch(tnet.request).calc($a,$b,$c,$d,$e)\n",
    )
    .unwrap();
    t.write("events/synthetic/calc/enable", "1\n").unwrap();
    request::trace(1, "get", 10);
    respond::trace(1, 40, 0);
    let lines = common::body_lines(&t.read("trace"));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].ends_with(": calc: a=122 b=10 c=30 d=31 e=18446744073709551615"),
        "{lines:?}"
    );
    assert_eq!(
        t.infos("tnet/respond"),
        ["hist:keys=id:vals=hitcount:a=t*3+2,b=t/4,c=t-$t0,d=t-5-3-1,e=t/status:sort=hitcount:size=2048:onmatch(tnet.request).calc($a,$b,$c,$d,$e) [active]"]
    );
}

// histogram.rst 2.2.2: a variable may hold the value of another event's variable
// (`file=$f`, eprobetrace.rst Example 3), and a synthetic event's hist may itself feed
// another synthetic event (the selftest's combined histogram).
#[test]
fn synthetic_events_chain_into_combined_histograms() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-chain");
    t.synth("waking_latency u64 lat; pid_t pid");
    t.synth("wakeup_latency2 u64 lat; pid_t pid");
    t.synth("waking_plus_wakeup_latency u64 lat; pid_t pid");
    t.append(
        "events/sched/sched_waking/trigger",
        "hist:keys=pid:ts0=common_timestamp.usecs if comm==\"ping\"\n",
    )
    .unwrap();
    t.append(
        "events/sched/sched_wakeup/trigger",
        "hist:keys=pid:waking_lat=common_timestamp.usecs-$ts0:onmatch(sched.sched_waking).waking_latency($waking_lat,pid) if comm==\"ping\"\n",
    )
    .unwrap();
    t.append(
        "events/sched/sched_wakeup/trigger",
        "hist:keys=pid:ts1=common_timestamp.usecs if comm==\"ping\"\n",
    )
    .unwrap();
    t.append(
        "events/sched/sched_switch/trigger",
        "hist:keys=next_pid:wakeup_lat=common_timestamp.usecs-$ts1:onmatch(sched.sched_wakeup).wakeup_latency2($wakeup_lat,next_pid) if next_comm==\"ping\"\n",
    )
    .unwrap();
    t.append(
        "events/synthetic/wakeup_latency2/trigger",
        "hist:keys=pid,lat:sort=pid,lat:ww_lat=$waking_lat+$wakeup_lat:onmatch(synthetic.wakeup_latency2).waking_plus_wakeup_latency($ww_lat,pid)\n",
    )
    .unwrap();
    t.append(
        "events/synthetic/waking_plus_wakeup_latency/trigger",
        "hist:keys=pid,lat:sort=pid,lat\n",
    )
    .unwrap();
    sched_waking::trace("ping", 77, 120, 0);
    sched_wakeup::trace("ping", 77, 120, 0);
    sched_switch::trace("swapper/0", 0, 120, 0, "ping", 77, 120);
    let entries = t.entries("synthetic/waking_plus_wakeup_latency");
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(
        entries[0].starts_with("{ pid:         77, lat: "),
        "{entries:?}"
    );
}

// The selftest trigger-field-variable-support.tc: event fields as synthetic parameters,
// on the target event (`next_pid`, `next_comm`) and on the matching event
// (`sched.sched_waking.prio`, which needs a hidden histogram there); removing the trigger
// removes that histogram too.
#[test]
fn field_variables_on_both_events() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-fieldvar");
    t.synth("wakeup_latency3 u64 lat; pid_t pid; int prio; char comm[16]");
    t.append(
        "events/sched/sched_waking/trigger",
        "hist:keys=comm:ts0=common_timestamp.usecs if comm==\"ping\"\n",
    )
    .unwrap();
    let switch = "hist:keys=next_comm:wakeup_lat=common_timestamp.usecs-$ts0:onmatch(sched.sched_waking).wakeup_latency3($wakeup_lat,next_pid,sched.sched_waking.prio,next_comm) if next_comm==\"ping\"";
    t.append("events/sched/sched_switch/trigger", &format!("{switch}\n"))
        .unwrap();
    t.append(
        "events/synthetic/wakeup_latency3/trigger",
        "hist:keys=pid,prio,comm:vals=lat:sort=pid,prio\n",
    )
    .unwrap();
    sched_waking::trace("ping", 4242, 120, 0);
    sched_switch::trace("swapper/0", 0, 120, 0, "ping", 4242, 120);

    let entries = t.entries("synthetic/wakeup_latency3");
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(
        entries[0].starts_with("{ pid:       4242, prio:        120, comm: ping "),
        "{entries:?}"
    );
    assert!(t.infos("sched/sched_waking").contains(
        &"hist:keys=comm:vals=hitcount:synthetic_prio=prio:sort=hitcount:size=2048 if comm==\"ping\" [active]"
            .to_string()
    ));
    t.append("events/sched/sched_switch/trigger", &format!("!{switch}\n"))
        .unwrap();
    assert!(!t
        .read("events/sched/sched_waking/hist")
        .contains("synthetic_prio=prio"));
}

// histogram.rst 2.2.3, onmax().save(): the largest latency per key and the fields of the
// event that set it, printed after the entry.
#[test]
fn onmax_save_keeps_the_context_of_the_maximum() {
    if skip_without_hist() {
        return;
    }
    let t = Instance::new("inter-onmax");
    t.append("events/tnet/request/trigger", "hist:keys=id:t0=t\n")
        .unwrap();
    t.append(
        "events/tnet/respond/trigger",
        "hist:keys=id:lat=t-$t0:onmax($lat).save(status,id)\n",
    )
    .unwrap();
    for (t0, t1, status) in [(100, 130, 200), (200, 210, 404), (300, 350, 500)] {
        request::trace(1, "get", t0);
        respond::trace(1, t1, status);
    }
    request::trace(2, "put", 0);
    respond::trace(2, 5, 201);
    let hist = t.read("events/tnet/respond/hist");
    assert!(
        hist.contains(
            "{ id:          1 } hitcount:          3\n\tmax:         50  status:        500  id:          1\n"
        ),
        "{hist}"
    );
    assert!(
        hist.contains(
            "{ id:          2 } hitcount:          1\n\tmax:          5  status:        201  id:          2\n"
        ),
        "{hist}"
    );
    assert_eq!(
        t.infos("tnet/respond"),
        ["hist:keys=id:vals=hitcount:lat=t-$t0:sort=hitcount:size=2048:onmax($lat).save(status,id) [active]"]
    );
}

// histogram.rst 2.2.3, onchange().save() and .snapshot() (the selftest
// trigger-snapshot-action-hist.tc): a changed value saves context and takes a snapshot.
#[test]
fn onchange_save_and_snapshot() {
    if skip_without_hist() {
        return;
    }
    let t = Instance::new("inter-onchange");
    t.write("events/sched/enable", "1\n").unwrap();
    t.append(
        "events/sched/sched_waking/trigger",
        "hist:keys=comm:newprio=prio:onchange($newprio).save(comm,prio):onchange($newprio).snapshot() if comm==\"ping\"\n",
    )
    .unwrap();
    sched_waking::trace("ping", 10, 120, 0);
    sched_waking::trace("ping", 10, 120, 0);
    sched_waking::trace("ping", 10, 121, 0);
    t.write("tracing_on", "0\n").unwrap();
    let hist = t.read("events/sched/sched_waking/hist");
    assert!(
        hist.contains(&format!(
            "\n\tchanged:        121  comm: {:<32}  prio:        121\n",
            "ping"
        )),
        "{hist}"
    );
    assert!(
        hist.contains("\nSnapshot taken (see tracing/snapshot).  Details:\n\ttriggering value { onchange($newprio) }:        121\ttriggered by event with key: { comm: ping"),
        "{hist}"
    );
    assert!(t.read("snapshot").contains("comm=ping"));
}

// The selftest trigger-action-hist-xfail.tc and the kernel's hist error table: each
// mistake is refused with its message and caret in error_log, and nothing is added.
#[test]
fn mistakes_are_refused_with_the_kernels_messages() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-errors");
    t.synth("req_lat3 u64 id; u64 lat");
    t.append("events/tnet/request/trigger", "hist:keys=id:t0=t\n")
        .unwrap();
    let loc = "hist:tnet:respond";
    let check = |body: &str, errno: Errno, message: &str, at: &str| {
        let r = t.append("events/tnet/respond/trigger", &format!("{body}\n"));
        assert_eq!(r, Err(errno), "{body}");
        t.assert_logged(loc, message, body, at);
        assert!(!t.read("events/tnet/respond/trigger").contains("hist:"));
    };
    check(
        "hist:keys=id:lat=t-$nosuch",
        Errno::EINVAL,
        "Couldn't find variable",
        "nosuch",
    );
    check(
        "hist:keys=id:lat=t-$t0:onmatch(tnet.request).trace(nosuch_synth,$lat)",
        Errno::EINVAL,
        "Couldn't find synthetic event",
        "nosuch_synth",
    );
    check(
        "hist:keys=id:lat=t-$t0:onmatch(tnet.request).trace(req_lat3,$lat)",
        Errno::EINVAL,
        "Param count doesn't match synthetic event field count",
        "req_lat3",
    );
    check(
        "hist:keys=id:lat=t-$t0:onmatch(tnet.request).trace(req_lat3,tnet.request.op,$lat)",
        Errno::EINVAL,
        "Param type doesn't match synthetic event field type",
        "op,",
    );
    check(
        "hist:keys=id:lat=t-$t0:onmatch(tnet.nosuch).trace(req_lat3,id,$lat)",
        Errno::EINVAL,
        "Invalid subsystem or event name",
        "nosuch",
    );
    check(
        "hist:keys=id:lat=t-$t0:onmatch(request).trace(req_lat3,id,$lat)",
        Errno::EINVAL,
        "Missing subsystem",
        "request",
    );
    check(
        "hist:keys=id:lat=t-$t0:onmatch(tnet.request).save(status)",
        Errno::EINVAL,
        "Handler doesn't support action",
        "save",
    );
    check(
        "hist:keys=id:lat=t-$t0:onmax(lat).save(status)",
        Errno::EINVAL,
        "For onmax(x) or onchange(x), x must be a variable",
        "lat",
    );
    check(
        "hist:keys=id:lat=t-$t0:onmax($nolat).save(status)",
        Errno::EINVAL,
        "Couldn't find onmax or onchange variable",
        "nolat",
    );
    check(
        "hist:keys=id:x=t/0",
        Errno(33), // EDOM
        "Division by zero",
        "0",
    );
    check(
        "hist:keys=id:x=t+t+t+t+t",
        Errno::EINVAL,
        "Too many subexpressions (3 max)",
        // The kernel's caret goes under the first "t" of the command.
        "t",
    );
    check(
        "hist:keys=id:x=common_timestamp-$t1",
        Errno::EINVAL,
        "Couldn't find variable",
        "t1",
    );
    check(
        "hist:keys=$t0",
        Errno::EINVAL,
        "Using variable references in keys not supported",
        "$t0",
    );
    check(
        "hist:keys=id:lat=t-$t0:onmatch(tnet.request).trace(req_lat3,id,$lat):onmax($lat).save(status):onmax($lat).save(id)",
        Errno::EEXIST,
        "Can't have more than one save() action per hist",
        "",
    );
    // A string is no operand.
    let op_ts = "hist:keys=id:x=op+1";
    let r = t.append("events/tnet/request/trigger", &format!("{op_ts}\n"));
    assert_eq!(r, Err(Errno::EINVAL));
    t.assert_logged(
        "hist:tnet:request",
        "String type can not be an operand in expression",
        op_ts,
        "op",
    );
}

// Timestamps in one expression must share their unit.
#[test]
fn timestamp_units_must_match() {
    if skip_without_hist() {
        return;
    }
    let t = Instance::new("inter-tsunits");
    t.append(
        "events/sched/sched_waking/trigger",
        "hist:keys=pid:ts0=common_timestamp.usecs\n",
    )
    .unwrap();
    let cmd = "hist:keys=next_pid:lat=common_timestamp-$ts0";
    assert_eq!(
        t.append("events/sched/sched_switch/trigger", &format!("{cmd}\n")),
        Err(Errno::EINVAL)
    );
    t.assert_logged(
        "hist:sched:sched_switch",
        "Timestamp units in expression don't match",
        cmd,
        "",
    );
}

// A trigger whose variables another trigger references cannot be removed (EBUSY), nor can
// a synthetic event an action generates; once the referencing trigger is gone, both can.
#[test]
fn referenced_variables_and_synthetic_events_are_busy() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-busy");
    t.synth("req_lat4 u64 id; u64 lat");
    t.append("events/tnet/request/trigger", "hist:keys=id:t0=t\n")
        .unwrap();
    let respond = "hist:keys=id:lat=t-$t0:onmatch(tnet.request).trace(req_lat4,id,$lat)";
    t.append("events/tnet/respond/trigger", &format!("{respond}\n"))
        .unwrap();
    assert_eq!(
        t.append("events/tnet/request/trigger", "!hist:keys=id:t0=t\n"),
        Err(Errno::EBUSY)
    );
    assert_eq!(
        common::append("synthetic_events", "!req_lat4\n"),
        Err(Errno::EBUSY)
    );
    t.append("events/tnet/respond/trigger", &format!("!{respond}\n"))
        .unwrap();
    t.append("events/tnet/request/trigger", "!hist:keys=id:t0=t\n")
        .unwrap();
    assert!(!t.read("events/tnet/request/trigger").contains("hist:"));
    // With the action gone, the synthetic event is free again.
    common::append("synthetic_events", "!req_lat4\n").unwrap();
    t.1.retain(|n| n != "req_lat4");
}

// Variables are not unique across events: an unqualified reference that two events
// define is refused; the qualified `sys.event.$var` form picks one (the selftest
// trigger-fully-qualified-var-ref.tc).
#[test]
fn qualified_references_pick_one_of_two_variables() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-qualified");
    t.synth("wl5 u64 lat; pid_t pid");
    t.append(
        "events/sched/sched_waking/trigger",
        "hist:keys=pid:ts0=common_timestamp.usecs\n",
    )
    .unwrap();
    t.append(
        "events/sched/sched_wakeup/trigger",
        "hist:keys=pid:ts0=common_timestamp.usecs\n",
    )
    .unwrap();
    let ambiguous = "hist:keys=next_pid:lat=common_timestamp.usecs-$ts0";
    assert_eq!(
        t.append(
            "events/sched/sched_switch/trigger",
            &format!("{ambiguous}\n")
        ),
        Err(Errno::EINVAL)
    );
    t.assert_logged(
        "hist:sched:sched_switch",
        "Variable name not unique, need to use fully qualified name (subsys.event.var) for variable",
        ambiguous,
        "ts0",
    );
    t.append(
        "events/sched/sched_switch/trigger",
        "hist:keys=next_pid:lat=common_timestamp.usecs-sched.sched_wakeup.$ts0:onmatch(sched.sched_waking).wl5($lat,next_pid)\n",
    )
    .unwrap();
    t.write("events/synthetic/wl5/enable", "1\n").unwrap();
    sched_waking::trace("a", 5, 120, 0);
    sched_wakeup::trace("a", 5, 120, 0);
    sched_switch::trace("b", 1, 120, 0, "a", 5, 120);
    let trace = t.read("trace");
    assert!(trace.contains(": wl5: lat="), "{trace}");
}

// histogram.rst 3: a latency histogram fed by two writes to trace_marker.
#[test]
fn trace_marker_start_end_latency() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-marker");
    // The example needs `buf == "start"` to tell the two markers apart.
    t.write(
        "events/ftrace/print/trigger",
        "hist:keys=common_pid if buf == \"start\"\n",
    )
    .unwrap();
    t.write("trace_marker", "end").unwrap();
    let told_apart = t.read("events/ftrace/print/hist").contains("    Hits: 0\n");
    t.append(
        "events/ftrace/print/trigger",
        "!hist:keys=common_pid if buf == \"start\"\n",
    )
    .unwrap();
    if !told_apart {
        println!("skipped: a filter on ftrace/print's buf does not tell \"end\" from \"start\"");
        return;
    }
    t.synth("latency u64 lat");
    t.write(
        "events/ftrace/print/trigger",
        "hist:keys=common_pid:ts0=common_timestamp.usecs if buf == \"start\"\n",
    )
    .unwrap();
    t.append(
        "events/ftrace/print/trigger",
        "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:onmatch(ftrace.print).latency($lat) if buf == \"end\"\n",
    )
    .unwrap();
    t.write(
        "events/synthetic/latency/trigger",
        "hist:keys=lat,common_pid:sort=lat\n",
    )
    .unwrap();
    for _ in 0..3 {
        t.write("trace_marker", "start").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
        t.write("trace_marker", "end").unwrap();
    }
    let hist = t.read("events/synthetic/latency/hist");
    assert!(
        hist.contains(
            "# trigger info: hist:keys=lat,common_pid:vals=hitcount:sort=lat:size=2048 [active]\n"
        ),
        "{hist}"
    );
    assert!(hist.contains("    Hits: 3\n"), "{hist}");
    for e in t.entries("synthetic/latency") {
        let lat: u64 = e["{ lat: ".len()..]
            .split(',')
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(lat >= 1000, "{e}");
    }
}

// eprobetrace.rst Example 3: the address of the file name saved at the entry event,
// passed through a synthetic event to the exit, read as a user string by an eprobe there.
#[test]
fn eprobe_example_3_reads_the_file_name_at_exit() {
    if skip_without_hist() {
        return;
    }
    let t = Instance::new("inter-eprobe3");
    common::append("dynamic_events", "s:filename u64 file\n").unwrap();
    t.write(
        "events/syscalls/sys_enter_openat/trigger",
        "hist:keys=common_pid:f=filename\n",
    )
    .unwrap();
    t.write(
        "events/syscalls/sys_exit_openat/trigger",
        "hist:keys=common_pid:file=$f:onmatch(syscalls.sys_enter_openat).trace(filename,$file)\n",
    )
    .unwrap();
    common::append(
        "dynamic_events",
        "e:openat synthetic.filename filename=+0($file):ustring\n",
    )
    .unwrap();
    t.write("events/eprobes/openat/enable", "1\n").unwrap();
    let names: [&std::ffi::CStr; 2] = [c"/etc/ld.so.cache", c"trace"];
    for name in names {
        sys_enter_openat::trace(-100, name.as_ptr() as u64, 0, 0);
        sys_exit_openat::trace(3);
    }
    let lines = common::body_lines(&t.read("trace"));
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].ends_with(": openat: (synthetic.filename) filename=\"/etc/ld.so.cache\""),
        "{lines:?}"
    );
    assert!(
        lines[1].ends_with(": openat: (synthetic.filename) filename=\"trace\""),
        "{lines:?}"
    );
    t.write("events/eprobes/openat/enable", "0\n").unwrap();
    drop(t);
    common::append("dynamic_events", "-:eprobes/openat\n").unwrap();
    common::append("dynamic_events", "-:synthetic/filename\n").unwrap();
}

// eprobetrace.rst Example 2: the same through an eprobe on raw_syscalls.sys_enter that
// pulls the address out of the argument array, filtered on the syscall number.
#[test]
fn eprobe_example_2_through_raw_syscalls() {
    if skip_without_hist() {
        return;
    }
    let t = Instance::new("inter-eprobe2");
    common::append(
        "dynamic_events",
        "e:openat_start raw_syscalls.sys_enter nr=$id filename=+8($args):x64\n",
    )
    .unwrap();
    common::append("dynamic_events", "s:filename2 u64 file\n").unwrap();
    t.write(
        "events/eprobes/openat_start/trigger",
        "hist:keys=common_pid:f=filename if nr == 257\n",
    )
    .unwrap();
    t.write(
        "events/raw_syscalls/sys_exit/trigger",
        "hist:keys=common_pid:file=$f:onmatch(eprobes.openat_start).trace(filename2,$file) if id == 257\n",
    )
    .unwrap();
    common::append(
        "dynamic_events",
        "e:openat2 synthetic.filename2 filename=+0($file):ustring\n",
    )
    .unwrap();
    t.write("events/eprobes/openat2/enable", "1\n").unwrap();
    let name = c"/lib/x86_64-linux-gnu/libc.so.6";
    sys_enter::trace(0, [0; 6]); // another syscall: filtered out on both sides
    sys_exit::trace(0, 0);
    sys_enter::trace(257, [u64::MAX - 99, name.as_ptr() as u64, 0, 0, 0, 0]);
    sys_exit::trace(257, 3);
    let lines = common::body_lines(&t.read("trace"));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].ends_with(
            ": openat2: (synthetic.filename2) filename=\"/lib/x86_64-linux-gnu/libc.so.6\""
        ),
        "{lines:?}"
    );
    t.write("events/eprobes/openat2/enable", "0\n").unwrap();
    drop(t);
    common::append("dynamic_events", "-:eprobes/openat2\n").unwrap();
    common::append("dynamic_events", "-:eprobes/openat_start\n").unwrap();
    common::append("dynamic_events", "-:synthetic/filename2\n").unwrap();
}

// The selftest trigger-multi-actions-accept.tc: several hist triggers on one event, one
// defining the variable and others passing it on qualified with their own event.
#[test]
fn several_triggers_with_actions_on_one_event() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-multi");
    t.synth("wakeup_latency6 u64 lat; pid_t pid");
    let trigger2 = "events/sched/sched_switch/trigger";
    t.write(
        "events/sched/sched_wakeup/trigger",
        "hist:keys=pid:ts0=common_timestamp.usecs if comm==\"cyclictest\"\n",
    )
    .unwrap();
    for line in [
        "hist:keys=next_pid:wakeup_lat=common_timestamp.usecs-$ts0 if next_comm==\"cyclictest\"",
        "hist:keys=next_pid:onmatch(sched.sched_wakeup).wakeup_latency6(sched.sched_switch.$wakeup_lat,next_pid) if next_comm==\"cyclictest\"",
        "hist:keys=next_pid:onmatch(sched.sched_wakeup).wakeup_latency6(sched.sched_switch.$wakeup_lat,prev_pid) if next_comm==\"cyclictest\"",
        "hist:keys=next_pid if next_comm==\"cyclictest\"",
    ] {
        t.append(trigger2, &format!("{line}\n")).unwrap();
    }
    assert_eq!(t.read(trigger2).lines().count(), 4);
    t.write("events/synthetic/wakeup_latency6/enable", "1\n")
        .unwrap();
    sched_wakeup::trace("cyclictest", 31, 9, 0);
    sched_switch::trace("swapper/0", 0, 120, 0, "cyclictest", 31, 9);
    let lines = common::body_lines(&t.read("trace"));
    // Both actions read $wakeup_lat of the first trigger, which they do not consume.
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().any(|l| l.contains(" pid=31")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains(" pid=0")), "{lines:?}");
}

// histogram.rst 2.2.3, onmax().snapshot(): the snapshot is taken when the latency beats
// the instance-wide maximum, and the hist file says which key triggered it.
#[test]
fn onmax_snapshot_reports_the_triggering_key() {
    if skip_without_hist() {
        return;
    }
    let t = Instance::new("inter-onmax-snap");
    t.write("events/tnet/enable", "1\n").unwrap();
    t.append("events/tnet/request/trigger", "hist:keys=id:t0=t\n")
        .unwrap();
    t.append(
        "events/tnet/respond/trigger",
        "hist:keys=id:lat=t-$t0:onmax($lat).save(status,id):onmax($lat).snapshot()\n",
    )
    .unwrap();
    for (id, t0, t1) in [(1, 100, 130), (2, 200, 290), (1, 300, 310)] {
        request::trace(id, "get", t0);
        respond::trace(id, t1, 200);
    }
    let hist = t.read("events/tnet/respond/hist");
    assert!(
        hist.contains("\nSnapshot taken (see tracing/snapshot).  Details:\n\ttriggering value { onmax($lat) }:         90\ttriggered by event with key: { id:          2 }\n"),
        "{hist}"
    );
    assert!(
        hist.contains("{ id:          1 } hitcount:          2\n\tmax:         30  status:        200  id:          1\n"),
        "{hist}"
    );
    let snapshot = t.read("snapshot");
    assert!(
        snapshot.contains("respond: id=2 t=290 status=200"),
        "{snapshot}"
    );
    assert!(!snapshot.contains("t=310"), "{snapshot}");
}

// histogram.rst 2.2.1/2.2.3: strings travel too — a string variable (`o=op`) and a string
// field of the matching event (`tnet.request.op`, through a hidden `synthetic_op=op`
// trigger) are kept per entry and passed to the synthetic event's char fields.
#[test]
fn string_variables_and_matching_event_strings_reach_the_synthetic_event() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-strings");
    t.synth("req_op u64 id; char op[16]; char op2[16]");
    t.append("events/tnet/request/trigger", "hist:keys=id:t0=t:o=op\n")
        .unwrap();
    t.append(
        "events/tnet/respond/trigger",
        "hist:keys=id:lat=t-$t0:onmatch(tnet.request).trace(req_op,id,$o,tnet.request.op)\n",
    )
    .unwrap();
    assert!(t.infos("tnet/request").contains(
        &"hist:keys=id:vals=hitcount:synthetic_op=op:sort=hitcount:size=2048 [active]".to_string()
    ));
    t.write("events/synthetic/req_op/enable", "1\n").unwrap();
    request::trace(5, "get", 10);
    request::trace(6, "delete", 11);
    respond::trace(6, 30, 200);
    respond::trace(5, 20, 200);
    let lines = common::body_lines(&t.read("trace"));
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].ends_with(": req_op: id=6 op=delete op2=delete"),
        "{lines:?}"
    );
    assert!(
        lines[1].ends_with(": req_op: id=5 op=get op2=get"),
        "{lines:?}"
    );
}

// Two writers at once, each adding a trigger whose field variable makes a hidden trigger on
// the other's event (so each locks its own event's trigger list and then the other's): the
// kernel serialises trigger changes with its event_mutex, and so must we, or the two wait
// for each other forever.
#[test]
fn crossed_inter_event_writes_at_once_do_not_deadlock() {
    if skip_without_hist() {
        return;
    }
    let mut t = Instance::new("inter-crossed");
    t.synth("crossed_a u64 lat; int prio");
    t.synth("crossed_b u64 lat; int prio");
    t.append(
        "events/sched/sched_waking/trigger",
        "hist:keys=pid:ts0=common_timestamp\n",
    )
    .unwrap();
    t.append(
        "events/sched/sched_switch/trigger",
        "hist:keys=next_pid:ts1=common_timestamp\n",
    )
    .unwrap();
    let a = (
        t.path("events/sched/sched_switch/trigger"),
        "hist:keys=next_pid:la=common_timestamp-$ts0:onmatch(sched.sched_waking).crossed_a($la,sched.sched_waking.prio)",
    );
    let b = (
        t.path("events/sched/sched_waking/trigger"),
        "hist:keys=pid:lb=common_timestamp-$ts1:onmatch(sched.sched_switch).crossed_b($lb,sched.sched_switch.next_prio)",
    );
    // Each alone is accepted (and leaves a hidden trigger on the other event).
    for (path, cmd) in [&a, &b] {
        common::append(path, &format!("{cmd}\n")).unwrap();
        common::append(path, &format!("!{cmd}\n")).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(1500);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for (path, cmd) in [a, b] {
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while std::time::Instant::now() < deadline {
                // Either may be refused while the other's trigger reads its variables.
                let _ = common::append(&path, &format!("{cmd}\n"));
                let _ = common::append(&path, &format!("!{cmd}\n"));
                rounds += 1;
            }
            done.send(rounds).unwrap();
        });
    }
    for _ in 0..2 {
        match done_rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(rounds) => assert!(rounds > 0),
            Err(_) => {
                // Unwinding would wait on the stuck writers' locks (removing the instance):
                // end the process so the failure is reported, not hung.
                eprintln!("a writer is stuck: the crossed writes deadlocked");
                std::process::exit(101);
            }
        }
    }
}
