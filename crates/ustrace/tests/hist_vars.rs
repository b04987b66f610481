//! Variables that carry a string or outlive their event (histogram.rst 2.2): `common_comm`
//! and `common_pid.execname` variables passed to a synthetic event as strings (the kernel's
//! "Allow execnames to be passed as args for synthetic events"), an alias of a string
//! variable (`x=$str`) that keeps the string, and the references of triggers that go away
//! with their instance given back, so nothing they read stays busy.

mod common;
#[path = "common/cpus.rs"]
mod cpus;

use ustrace::{Errno, FileSystem};

/// Counting is per thread (`count_on_this_thread`): the other tests' threads allocate while
/// they wait their turn.
#[global_allocator]
static GLOBAL: ustrace_testalloc::CountingAllocator = ustrace_testalloc::CountingAllocator;

// A request/response pair keyed by `id`, as the inter-event tests' `tnet`.
ustrace::trace_event! {
    pub fn hv::request(id: u64, op: &str, t: u64) {
        id: u64 = id,
        op: ustrace::FixedStr<16> = ustrace::FixedStr::new(op),
        t: u64 = t,
    }
    print "id=%llu op=%s t=%llu", id, op, t;
}

ustrace::trace_event! {
    pub fn hv::respond(id: u64, t: u64, status: i32) {
        id: u64 = id,
        t: u64 = t,
        status: i32 = status,
    }
    print "id=%llu t=%llu status=%d", id, t, status;
}

/// Synthetic events are global: the tests run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Instances made for a test, and synthetic events defined for it, removed at its end.
struct Fixture {
    instances: Vec<String>,
    synths: Vec<String>,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Fixture {
    fn new(instances: &[&str]) -> Fixture {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        for name in instances {
            let _ = ustrace::tracefs().rmdir(&format!("instances/{name}"));
            ustrace::tracefs()
                .mkdir(&format!("instances/{name}"))
                .unwrap();
        }
        Fixture {
            instances: instances.iter().map(|s| s.to_string()).collect(),
            synths: Vec::new(),
            _serial: serial,
        }
    }

    fn synth(&mut self, def: &str) {
        common::append("synthetic_events", &format!("{def}\n")).unwrap();
        self.synths
            .push(def.split_whitespace().next().unwrap().to_string());
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for name in &self.instances {
            let _ = ustrace::tracefs().rmdir(&format!("instances/{name}"));
        }
        for name in self.synths.drain(..).rev() {
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

fn path(instance: &str, p: &str) -> String {
    format!("instances/{instance}/{p}")
}

/// Runs `f` on a new thread named `name` (its comm), and waits for it.
fn as_thread(name: &str, f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

/// The synthetic event lines of the instance's trace, each from `: NAME: ` on.
fn synth_lines(instance: &str, name: &str) -> Vec<String> {
    let marker = format!(": {name}: ");
    common::body_lines(&common::read(&path(instance, "trace")).unwrap())
        .iter()
        .filter_map(|l| l.find(&marker).map(|at| l[at + 2..].to_string()))
        .collect()
}

/// Asserts the instance's error_log holds `message` for `command`, the caret under the
/// first occurrence of `at`.
fn assert_logged(instance: &str, event: &str, message: &str, command: &str, at: &str) {
    let log = common::read(&path(instance, "error_log")).unwrap();
    let pos = command.find(at).expect("caret text in command");
    let want = format!(
        "hist:{event}: error: {message}\n  Command: {command}\n{}^\n",
        " ".repeat(pos + "  Command: ".len())
    );
    assert!(log.contains(&want), "want:\n{want}\nin error_log:\n{log}");
}

// `c=common_comm` saves the name of the task that hit the event on every update;
// `w=common_pid.execname` the name of the task that made the entry (the kernel saves it
// when the entry is initialised). Both are `char[]` strings: into a `char[]` field of a
// synthetic event they go as text, directly or through an alias; a fixed-size `char[16]`
// field takes neither (its size is not theirs), as on the kernel.
#[test]
fn comm_and_execname_variables_reach_the_synthetic_event_as_strings() {
    if skip_without_hist() {
        return;
    }
    let mut fx = Fixture::new(&["hv-comm"]);
    let i = "hv-comm";
    fx.synth("hv_who u64 id; char comm[]; char exec[]; char alias[]");
    fx.synth("hv_who16 u64 id; char comm[16]");
    common::append(
        &path(i, "events/hv/request/trigger"),
        "hist:keys=id:c=common_comm,w=common_pid.execname\n",
    )
    .unwrap();
    assert!(
        common::read(&path(i, "events/hv/request/trigger"))
            .unwrap()
            .contains("c=common_comm,w=common_pid.execname"),
        "{}",
        common::read(&path(i, "events/hv/request/trigger")).unwrap()
    );
    let refused = "hist:keys=id:onmatch(hv.request).trace(hv_who16,id,$c)";
    assert_eq!(
        common::append(
            &path(i, "events/hv/respond/trigger"),
            &format!("{refused}\n")
        ),
        Err(Errno::EINVAL)
    );
    assert_logged(
        i,
        "hv:respond",
        "Param type doesn't match synthetic event field type",
        refused,
        "$c",
    );
    common::append(
        &path(i, "events/hv/respond/trigger"),
        "hist:keys=id:a=$w:onmatch(hv.request).trace(hv_who,id,$c,$w,$a)\n",
    )
    .unwrap();
    common::write(&path(i, "events/synthetic/hv_who/enable"), "1\n").unwrap();
    as_thread("hv-first", || request::trace(7, "get", 1));
    as_thread("hv-second", || request::trace(7, "get", 2));
    as_thread("hv-responder", || respond::trace(7, 3, 200));
    assert_eq!(
        synth_lines(i, "hv_who"),
        vec!["hv_who: id=7 comm=hv-second exec=hv-first alias=hv-first".to_string()]
    );
}

// A `common_comm` parameter names the thread that hit the event the trigger is on, as the
// kernel's field variable made on the target event; qualified with the matching event
// (`hv.request.common_comm`), the thread that hit that one, kept by a hidden trigger there.
#[test]
fn a_common_comm_parameter_is_the_target_events_thread() {
    if skip_without_hist() {
        return;
    }
    let mut fx = Fixture::new(&["hv-param"]);
    let i = "hv-param";
    fx.synth("hv_param u64 id; char here[]; char there[]");
    common::append(&path(i, "events/hv/request/trigger"), "hist:keys=id:t0=t\n").unwrap();
    common::append(
        &path(i, "events/hv/respond/trigger"),
        "hist:keys=id:onmatch(hv.request).trace(hv_param,id,common_comm,hv.request.common_comm)\n",
    )
    .unwrap();
    common::write(&path(i, "events/synthetic/hv_param/enable"), "1\n").unwrap();
    as_thread("hv-asker", || request::trace(4, "get", 1));
    as_thread("hv-answerer", || respond::trace(4, 3, 200));
    assert_eq!(
        synth_lines(i, "hv_param"),
        vec!["hv_param: id=4 here=hv-answerer there=hv-asker".to_string()]
    );
}

// Unqualified `common_timestamp` and `common_cpu` parameters are the event the trigger is
// on, as `common_comm` is: the kernel makes field variables of them on the target event.
// Taken from the matching event instead, the answer's time would be the question's and
// its CPU the asker's.
#[test]
fn common_timestamp_and_cpu_parameters_are_the_target_events() {
    if skip_without_hist() {
        return;
    }
    let mut fx = Fixture::new(&["hv-when"]);
    let i = "hv-when";
    fx.synth("hv_when u64 id; u64 asked; u64 answered; unsigned int cpu");
    common::append(
        &path(i, "events/hv/request/trigger"),
        "hist:keys=id:t0=common_timestamp\n",
    )
    .unwrap();
    common::append(
        &path(i, "events/hv/respond/trigger"),
        "hist:keys=id:onmatch(hv.request).trace(hv_when,id,$t0,common_timestamp,common_cpu)\n",
    )
    .unwrap();
    common::write(&path(i, "events/synthetic/hv_when/enable"), "1\n").unwrap();
    let cpus = cpus::allowed_cpus();
    let (asker, answerer) = (cpus[0], *cpus.last().unwrap());
    cpus::on_cpu(asker, || request::trace(5, "get", 1));
    std::thread::sleep(std::time::Duration::from_millis(20));
    cpus::on_cpu(answerer, || respond::trace(5, 3, 200));
    let lines = synth_lines(i, "hv_when");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let value = |name: &str| -> u64 {
        let at = lines[0].find(&format!(" {name}=")).expect(name) + name.len() + 2;
        let digits: String = lines[0][at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().expect(name)
    };
    let (asked, answered) = (value("asked"), value("answered"));
    // The instance's clock is `local`, in nanoseconds: 20 ms lie between the two events.
    assert!(
        answered >= asked + 20_000_000,
        "asked {asked}, answered {answered}: {}",
        lines[0]
    );
    assert_eq!(value("cpu"), answerer as u64, "{}", lines[0]);
    if asker == answerer {
        println!("skipped (in part): one CPU allowed, so the CPUs cannot differ");
    }
}

// An alias of a string variable (`x=$o`) keeps the string: passed on, it carries the
// text the variable it names saved, into a dynamic `char[]` field and into a `char[16]`
// field of the variable's own size.
#[test]
fn an_alias_of_a_string_variable_passes_the_string() {
    if skip_without_hist() {
        return;
    }
    let mut fx = Fixture::new(&["hv-alias"]);
    let i = "hv-alias";
    fx.synth("hv_op u64 id; char op[]; char op16[16]");
    common::append(&path(i, "events/hv/request/trigger"), "hist:keys=id:o=op\n").unwrap();
    common::append(
        &path(i, "events/hv/respond/trigger"),
        "hist:keys=id:x=$o:onmatch(hv.request).trace(hv_op,id,$x,$x)\n",
    )
    .unwrap();
    common::write(&path(i, "events/synthetic/hv_op/enable"), "1\n").unwrap();
    request::trace(1, "get", 10);
    request::trace(2, "delete", 11);
    respond::trace(2, 20, 200);
    respond::trace(1, 21, 200);
    assert_eq!(
        synth_lines(i, "hv_op"),
        vec![
            "hv_op: id=2 op=delete op16=delete".to_string(),
            "hv_op: id=1 op=get op16=get".to_string(),
        ]
    );
}

// A histogram shared by `name=` across two instances, whose variable a trigger of the first
// instance reads: removing that instance takes the reading trigger with it, so the shared
// histogram is no longer referenced (its removal from the other instance succeeds) and the
// synthetic event the reader generated is free again, as when the kernel frees the
// triggers of a removed instance.
#[test]
fn triggers_gone_with_their_instance_give_back_their_references() {
    if skip_without_hist() {
        return;
    }
    let mut fx = Fixture::new(&["hv-x", "hv-y"]);
    fx.synth("hv_lat u64 id; u64 lat");
    let named = "hist:name=hv_named:keys=id:t0=t";
    let reader = "hist:keys=id:lat=t-$t0:onmatch(hv.request).trace(hv_lat,id,$lat)";
    let x_request = path("hv-x", "events/hv/request/trigger");
    let y_request = path("hv-y", "events/hv/request/trigger");
    common::append(&x_request, &format!("{named}\n")).unwrap();
    common::append(
        &path("hv-x", "events/hv/respond/trigger"),
        &format!("{reader}\n"),
    )
    .unwrap();
    common::append(&y_request, &format!("{named}\n")).unwrap();
    // Referenced: neither sharer may remove it, nor may the synthetic event go.
    assert_eq!(
        common::append(&y_request, &format!("!{named}\n")),
        Err(Errno::EBUSY)
    );
    assert_eq!(
        common::append("synthetic_events", "!hv_lat\n"),
        Err(Errno::EBUSY)
    );
    ustrace::tracefs().rmdir("instances/hv-x").unwrap();
    common::append(&y_request, &format!("!{named}\n")).unwrap();
    assert!(!common::read(&y_request).unwrap().contains("hist:"));
    common::append("synthetic_events", "!hv_lat\n").unwrap();
    fx.synths.retain(|n| n != "hv_lat");
}

// While another trigger still shares a named histogram, removing one of its triggers gives
// back nothing the histogram holds: its variables stay defined for new references.
#[test]
fn a_shared_histogram_keeps_its_variables_until_its_last_trigger_goes() {
    if skip_without_hist() {
        return;
    }
    let mut fx = Fixture::new(&["hv-p", "hv-q"]);
    fx.synth("hv_lat2 u64 id; u64 lat");
    let named = "hist:name=hv_named2:keys=id:t0=t";
    let reader = "hist:keys=id:lat=t-$t0:onmatch(hv.request).trace(hv_lat2,id,$lat)";
    let p_request = path("hv-p", "events/hv/request/trigger");
    let q_request = path("hv-q", "events/hv/request/trigger");
    common::append(&p_request, &format!("{named}\n")).unwrap();
    common::append(&q_request, &format!("{named}\n")).unwrap();
    common::append(&q_request, &format!("!{named}\n")).unwrap();
    common::append(
        &path("hv-p", "events/hv/respond/trigger"),
        &format!("{reader}\n"),
    )
    .unwrap();
    common::write(&path("hv-p", "events/synthetic/hv_lat2/enable"), "1\n").unwrap();
    request::trace(3, "get", 100);
    respond::trace(3, 130, 200);
    assert_eq!(
        synth_lines("hv-p", "hv_lat2"),
        vec!["hv_lat2: id=3 lat=30".to_string()]
    );
}

// The record path of task-name variables allocates nothing: the thread's name is read from
// its cache (filled on the thread's first event), stored in the entry, and passed on as a
// string, directly and through an alias.
#[test]
fn saving_and_passing_task_names_allocates_nothing() {
    if skip_without_hist() {
        return;
    }
    let mut fx = Fixture::new(&["hv-noalloc"]);
    let i = "hv-noalloc";
    fx.synth("hv_names u64 id; char comm[]; char exec[]; char alias[]");
    common::append(
        &path(i, "events/hv/request/trigger"),
        "hist:keys=id:c=common_comm,w=common_pid.execname\n",
    )
    .unwrap();
    common::append(
        &path(i, "events/hv/respond/trigger"),
        "hist:keys=id:a=$c:onmatch(hv.request).trace(hv_names,id,$c,$w,$a)\n",
    )
    .unwrap();
    common::write(&path(i, "events/synthetic/hv_names/enable"), "1\n").unwrap();
    let mut id = 0u64;
    let mut pair = || {
        id = (id + 7) % 1000;
        request::trace(id, "get", 1);
        respond::trace(id, 2, 200);
    };
    pair(); // the thread's first event: its id and name are cached
    let allocations = ustrace_testalloc::count_on_this_thread(|| {
        for _ in 0..10_000 {
            pair();
        }
    });
    assert_eq!(allocations, 0);
    let names = synth_lines(i, "hv_names");
    let comm = std::thread::current()
        .name()
        .map(|n| n.chars().take(15).collect::<String>())
        .unwrap_or_default();
    let last = names.last().expect("events recorded");
    assert!(
        last.ends_with(&format!("comm={comm} exec={comm} alias={comm}")),
        "{last}"
    );
}
