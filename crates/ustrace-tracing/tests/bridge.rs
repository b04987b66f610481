//! `tracing` callsites and spans as ustrace events, driven through tracefs as a shell would.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use ustrace::{Errno, FileSystem, OpenFlags};

/// Events of the `bridge::net` target that a second, ordinary layer saw.
static OTHER_LAYER_SAW: AtomicUsize = AtomicUsize::new(0);

struct Counting;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Counting {
    fn on_event(&self, event: &tracing::Event<'_>, _cx: Context<'_, S>) {
        if event.metadata().target() == "bridge::net" {
            OTHER_LAYER_SAW.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn setup() -> MutexGuard<'static, ()> {
    static INIT: Once = Once::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    INIT.call_once(|| {
        tracing_subscriber::registry()
            .with(ustrace_tracing::layer())
            .with(Counting)
            .init();
    });
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn read(path: &str) -> String {
    let mut file = ustrace::tracefs().open(path, OpenFlags::READ).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = file.read(&mut buf, None).unwrap();
        if n == 0 {
            return String::from_utf8_lossy(&out).into_owned();
        }
        out.extend_from_slice(&buf[..n]);
    }
}

fn write(path: &str, text: &str) -> Result<(), Errno> {
    let mut file = ustrace::tracefs().open(path, OpenFlags::TRUNCATE)?;
    file.write(text.as_bytes()).map(|_| ())
}

/// An instance of its own per test, removed at the end.
struct Instance(String);

impl Instance {
    fn new(name: &str) -> Instance {
        let _ = ustrace::tracefs().rmdir(&format!("instances/{name}"));
        ustrace::tracefs()
            .mkdir(&format!("instances/{name}"))
            .unwrap();
        Instance(name.into())
    }
    fn path(&self, p: &str) -> String {
        format!("instances/{}/{p}", self.0)
    }
    fn write(&self, p: &str, text: &str) -> Result<(), Errno> {
        write(&self.path(p), text)
    }
    fn read(&self, p: &str) -> String {
        read(&self.path(p))
    }
    fn lines(&self) -> Vec<String> {
        self.read("trace")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(String::from)
            .collect()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.write("events/enable", "0");
        let _ = ustrace::tracefs().rmdir(&format!("instances/{}", self.0));
    }
}

mod net {
    pub fn served(status: u64, path: &str) {
        tracing::info!(name: "served", status, path, "request done");
    }
    /// A callsite with the default name (`event FILE:LINE`); returns its line.
    pub fn plain() -> u32 {
        tracing::warn!(retries = 3i64, ok = true);
        line!() - 1
    }
}

mod dup {
    pub fn twice() {
        tracing::info!(name: "dup", n = 1u64);
        tracing::info!(name: "dup", n = 2u64);
        drop(tracing::info_span!("pair"));
        drop(tracing::info_span!("pair"));
    }
}

mod db {
    pub fn query(rows: i64) {
        tracing::debug!(name: "query", target: "db::pool-conn", rows, ratio = 0.75f64, "ran");
    }
}

#[test]
fn callsites_of_two_targets_are_events_with_formats() {
    let _serial = setup();
    net::served(200, "/a");
    let line = net::plain();
    db::query(1);
    dup::twice();
    let available = read("available_events");
    for event in [
        "dup",
        "dup_2",
        "pair_enter",
        "pair_exit",
        "pair_2_enter",
        "pair_2_exit",
    ] {
        assert!(
            available.contains(&format!("bridge_dup:{event}\n")),
            "bridge_dup:{event} missing from available_events:\n{available}"
        );
    }
    let plain = format!("bridge_net:bridge_{line}");
    for event in ["bridge_net:served", plain.as_str(), "db_pool_conn:query"] {
        assert!(
            available.lines().any(|l| l == event),
            "{event} missing from available_events:\n{available}"
        );
    }
    let format = read("events/bridge_net/served/format");
    assert!(format.starts_with("name: served\nID: "), "{format}");
    for field in [
        "\tfield:int level;\toffset:8;\tsize:4;\tsigned:1;",
        "\tfield:__data_loc char[] message;\toffset:12;\tsize:4;\tsigned:0;",
        "\tfield:s64 status;\toffset:16;\tsize:8;\tsigned:1;",
        "\tfield:s64 path;\toffset:24;\tsize:8;\tsigned:1;",
        "\tfield:__data_loc char[] status_str;\toffset:32;\tsize:4;\tsigned:0;",
        "\tfield:__data_loc char[] path_str;\toffset:36;\tsize:4;\tsigned:0;",
    ] {
        assert!(format.contains(field), "{field:?} not in\n{format}");
    }
    let id: u32 = read("events/bridge_net/served/id").trim().parse().unwrap();
    assert!(format.contains(&format!("ID: {id}\n")));
}

#[test]
fn enable_filter_and_trigger_work_on_a_callsite() {
    let _serial = setup();
    let t = Instance::new("bridge_filter");
    net::served(1, "/warmup");
    t.write(
        "events/bridge_net/served/filter",
        "status >= 500 && path_str ~ \"/api/*\"",
    )
    .unwrap();
    t.write(
        "events/bridge_net/served/trigger",
        "traceoff if status == 599",
    )
    .unwrap();
    t.write("events/bridge_net/served/enable", "1").unwrap();
    net::served(200, "/api/ok");
    net::served(503, "/api/down");
    net::served(502, "/static/x");
    db::query(7);
    let lines = t.lines();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("served: INFO request done status=503 path=/api/down"),
        "{}",
        lines[0]
    );
    assert_eq!(t.read("tracing_on"), "1\n");
    net::served(599, "/x");
    assert_eq!(
        t.read("tracing_on"),
        "0\n",
        "the traceoff trigger did not fire"
    );
    net::served(500, "/api/after");
    assert_eq!(t.lines().len(), 1, "recorded while tracing was off");
    t.write(
        "events/bridge_net/served/trigger",
        "!traceoff if status == 599",
    )
    .unwrap();
    t.write("tracing_on", "1").unwrap();
    t.write(
        "events/bridge_net/served/trigger",
        "stacktrace if status == 503",
    )
    .unwrap();
    net::served(503, "/api/again");
    let trace = t.read("trace");
    assert!(
        trace.contains("<stack trace>") && trace.contains("=> "),
        "no stack after the triggering event:\n{trace}"
    );
    t.write(
        "events/bridge_net/served/trigger",
        "!stacktrace if status == 503",
    )
    .unwrap();
    t.write("trace", "").unwrap();

    // Floats, signed integers and level: another event, filtered on its level.
    t.write("events/db_pool_conn/query/filter", "level == 4 && rows < 0")
        .unwrap();
    t.write("events/db_pool_conn/query/enable", "1").unwrap();
    db::query(5);
    db::query(-2);
    let lines = t.lines();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("query: DEBUG ran rows=-2 ratio=0.75"),
        "{}",
        lines[0]
    );
}

#[test]
fn a_disabled_callsite_records_nothing_and_other_layers_see_everything() {
    let _serial = setup();
    let t = Instance::new("bridge_off");
    let before = OTHER_LAYER_SAW.load(Ordering::SeqCst);
    net::served(200, "/before");
    t.write("events/bridge_net/served/enable", "1").unwrap();
    net::served(201, "/on");
    t.write("events/bridge_net/served/enable", "0").unwrap();
    net::served(202, "/after");
    let lines = t.lines();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("status=201"), "{}", lines[0]);
    assert_eq!(OTHER_LAYER_SAW.load(Ordering::SeqCst) - before, 3);
}

#[tracing::instrument(level = "info")]
fn step(job: u64, round: u64) {
    tracing::trace!(target: "bridge::inner", job, "inside");
}

fn moving() -> tracing::Span {
    tracing::info_span!("moving", job = 9u64)
}

#[test]
fn spans_pair_up_across_threads() {
    let _serial = setup();
    let t = Instance::new("bridge_spans");
    // Register the span callsite, then enable its events.
    step(0, 0);
    let available = read("available_events");
    assert!(
        available.contains("bridge:step_enter\n") && available.contains("bridge:step_exit\n"),
        "{available}"
    );
    t.write("events/bridge/step_enter/enable", "1").unwrap();
    t.write("events/bridge/step_exit/enable", "1").unwrap();
    let threads: Vec<_> = (1..=4u64)
        .map(|job| {
            std::thread::spawn(move || {
                for round in 0..50 {
                    step(job, round);
                }
            })
        })
        .collect();
    // One span entered on several threads in turn, as a task that migrates.
    drop(moving());
    t.write("events/bridge/moving_enter/enable", "1").unwrap();
    t.write("events/bridge/moving_exit/enable", "1").unwrap();
    let moving = moving();
    for _ in 0..3 {
        let span = moving.clone();
        std::thread::spawn(move || {
            let _entered = span.enter();
        })
        .join()
        .unwrap();
    }
    for thread in threads {
        thread.join().unwrap();
    }
    let all = t.lines();
    let moved: Vec<&String> = all.iter().filter(|l| l.contains("moving_")).collect();
    assert_eq!(moved.len(), 6, "{all:#?}");
    let tasks: std::collections::HashSet<&str> = moved
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(tasks.len(), 3, "entered on three threads: {moved:#?}");
    let ids: std::collections::HashSet<&str> = moved
        .iter()
        .map(|l| l.split("span_id=").nth(1).unwrap())
        .collect();
    assert_eq!(ids.len(), 1, "one span id throughout: {moved:#?}");
    let lines: Vec<String> = all.into_iter().filter(|l| l.contains("step_")).collect();
    // Each thread's lines alternate enter/exit of one span id.
    let mut open: std::collections::HashMap<String, String> = Default::default();
    let mut pairs = 0;
    for line in &lines {
        let task = line.split_whitespace().next().unwrap().to_string();
        let id = line
            .split("span_id=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap()
            .to_string();
        if line.contains("step_enter:") {
            assert!(open.insert(task, id).is_none(), "enter twice: {line}");
        } else {
            assert!(line.contains("step_exit:"), "{line}");
            assert_eq!(open.remove(&task), Some(id), "unpaired exit: {line}");
            pairs += 1;
        }
    }
    assert!(open.is_empty(), "{open:?}");
    assert_eq!(pairs, 200, "{lines:#?}");
    assert!(lines[0].contains("INFO span_id="), "{}", lines[0]);
    assert!(lines
        .iter()
        .all(|l| l.contains(" job=") && l.contains(" round=")));
}

mod alt {
    pub fn first(n: u64) {
        tracing::info!(name: "first", n);
    }
    pub fn second(n: u64) {
        tracing::info!(name: "second", n, twice = n * 2);
    }
}

/// A thread remembers the callsite it recorded last: callsites that alternate on one
/// thread must still each record their own event, with their own layout.
#[test]
fn alternating_callsites_record_their_own_events() {
    let _serial = setup();
    let t = Instance::new("bridge_alternate");
    alt::first(0);
    alt::second(0);
    t.write("events/bridge_alt/first/enable", "1").unwrap();
    t.write("events/bridge_alt/second/enable", "1").unwrap();
    for n in 1..=20 {
        alt::first(n);
        alt::second(n);
        alt::second(n + 100);
    }
    let lines = t.lines();
    assert_eq!(lines.len(), 60, "{lines:#?}");
    for (i, chunk) in lines.chunks(3).enumerate() {
        let n = i as u64 + 1;
        assert!(
            chunk[0].ends_with(&format!("first: INFO n={n}")),
            "{chunk:#?}"
        );
        assert!(
            chunk[1].ends_with(&format!("second: INFO n={n} twice={}", n * 2)),
            "{chunk:#?}"
        );
        assert!(
            chunk[2].ends_with(&format!(
                "second: INFO n={} twice={}",
                n + 100,
                (n + 100) * 2
            )),
            "{chunk:#?}"
        );
    }
}

mod nest {
    /// A value whose `Debug` emits an event of its own while it is being formatted.
    pub struct Chatty(pub u64);

    impl std::fmt::Debug for Chatty {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            tracing::info!(name: "inner", depth = self.0);
            write!(f, "chatty#{}", self.0)
        }
    }

    pub fn outer(n: u64, long: &str) {
        tracing::info!(name: "outer", n, v = ?Chatty(n), long);
    }
}

/// Records are built in the caller's frame: an event emitted by a `Debug` impl while the
/// outer record is half built gets a record of its own and leaves the outer one whole, and
/// text longer than a record holds is cut where the record ends, not past it.
#[test]
fn a_nested_event_and_an_overlong_text_keep_their_records_whole() {
    let _serial = setup();
    let t = Instance::new("bridge_nest");
    nest::outer(0, "");
    // The inner callsite registers when it is first reached.
    let _ = format!("{:?}", nest::Chatty(0));
    t.write("events/bridge_nest/outer/enable", "1").unwrap();
    t.write("events/bridge_nest/inner/enable", "1").unwrap();
    let long = "x".repeat(5000);
    nest::outer(7, &long);
    let lines = t.lines();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[0].ends_with("inner: INFO depth=7"), "{lines:#?}");
    let outer = &lines[1];
    assert!(
        outer.contains("outer: INFO n=7 v=chatty#7 long=xxx"),
        "{outer}"
    );
    let xs = outer.len() - outer.trim_end_matches('x').len();
    // The record is at most 3072 bytes; the fixed part and the other text come first.
    assert!(xs > 2900 && xs < 3072, "{xs} x's");
}
