//! The bridge under tokio: the `shop` service (another crate, instrumented only with
//! `tracing`) on a multi-thread runtime, traced through tracefs as a shell would.
//!
//! The global subscriber is the registry with the ustrace layer, wrapped in [`Counted`],
//! which counts what reaches the subscriber from `shop`'s callsites: a callsite whose
//! cached interest is `never` does not reach it at all, which is how "a callsite turned
//! off stops costing" is observed.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

use tracing_core::span::{Attributes, Current, Id, Record};
use tracing_core::subscriber::Interest;
use tracing_core::{Event, LevelFilter, Metadata, Subscriber};
use tracing_subscriber::layer::SubscriberExt;
use ustrace::FileSystem;

/// Events of `shop::api`'s `served` callsite that reached the subscriber.
static SERVED_REACHED: AtomicUsize = AtomicUsize::new(0);
/// `handle` spans of `shop::api` that reached the subscriber.
static HANDLE_REACHED: AtomicUsize = AtomicUsize::new(0);

/// A subscriber that counts, then hands everything to the one it wraps.
struct Counted<S>(S);

impl<S: Subscriber> Subscriber for Counted<S> {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        self.0.register_callsite(meta)
    }
    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.0.max_level_hint()
    }
    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        self.0.enabled(meta)
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let meta = attrs.metadata();
        if meta.target() == "shop::api" && meta.name() == "handle" {
            HANDLE_REACHED.fetch_add(1, Ordering::Relaxed);
        }
        self.0.new_span(attrs)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        self.0.record(span, values)
    }
    fn record_follows_from(&self, span: &Id, follows: &Id) {
        self.0.record_follows_from(span, follows)
    }
    fn event_enabled(&self, event: &Event<'_>) -> bool {
        self.0.event_enabled(event)
    }
    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        if meta.target() == "shop::api" && meta.name() == "served" {
            SERVED_REACHED.fetch_add(1, Ordering::Relaxed);
        }
        self.0.event(event)
    }
    fn enter(&self, span: &Id) {
        self.0.enter(span)
    }
    fn exit(&self, span: &Id) {
        self.0.exit(span)
    }
    fn clone_span(&self, id: &Id) -> Id {
        self.0.clone_span(id)
    }
    fn try_close(&self, id: Id) -> bool {
        self.0.try_close(id)
    }
    fn current_span(&self) -> Current {
        self.0.current_span()
    }
    unsafe fn downcast_raw(&self, id: std::any::TypeId) -> Option<*const ()> {
        if id == std::any::TypeId::of::<Self>() {
            return Some(self as *const Self as *const ());
        }
        // SAFETY: forwarded as is; the wrapped subscriber answers for its own types.
        unsafe { self.0.downcast_raw(id) }
    }
}

fn setup() -> MutexGuard<'static, ()> {
    static INIT: Once = Once::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    INIT.call_once(|| {
        let subscriber = Counted(tracing_subscriber::registry().with(ustrace_tracing::layer()));
        tracing::subscriber::set_global_default(subscriber).unwrap();
    });
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The service on a runtime of four workers, and a client on the same runtime.
struct Service {
    runtime: tokio::runtime::Runtime,
    addr: SocketAddr,
    next: u64,
}

impl Service {
    fn start() -> Service {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        let addr = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(shop::server::serve(listener));
            addr
        });
        Service {
            runtime,
            addr,
            next: 0,
        }
    }

    /// `conns` connections of `per_conn` requests each, concurrently; every status.
    fn load(&mut self, conns: u64, per_conn: u64) -> Vec<u16> {
        let first = self.next;
        self.next += conns * per_conn;
        // A callsite of this crate, beside `shop`'s.
        tracing::info!(name: "round", conns, per_conn);
        let statuses = self
            .runtime
            .block_on(shop::server::load(self.addr, conns, per_conn, first))
            .unwrap();
        statuses.into_iter().flatten().collect()
    }
}

/// An instance of its own per test, removed at the end.
struct Instance(String);

impl Instance {
    fn new(name: &str) -> Instance {
        let _ = ustrace::tracefs().rmdir(&format!("instances/{name}"));
        ustrace::tracefs()
            .mkdir(&format!("instances/{name}"))
            .unwrap();
        let t = Instance(name.into());
        t.write("buffer_size_kb", "4096");
        t
    }
    fn write(&self, p: &str, text: &str) {
        ustrace::tracefs()
            .write_file(&format!("instances/{}/{p}", self.0), text)
            .unwrap_or_else(|e| panic!("{p} < {text:?}: {e:?}"));
    }
    fn lines(&self) -> Vec<String> {
        ustrace::tracefs()
            .read_to_string(&format!("instances/{}/trace", self.0))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(String::from)
            .collect()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = ustrace::tracefs().write_file(&format!("instances/{}/events/enable", self.0), "0");
        let _ = ustrace::tracefs().rmdir(&format!("instances/{}", self.0));
    }
}

fn available() -> String {
    ustrace::tracefs()
        .read_to_string("available_events")
        .unwrap()
}

/// A trace line's thread id and event name.
fn task_and_event(line: &str) -> (&str, &str) {
    let task = line.split_whitespace().next().unwrap();
    let tid = task.rsplit('-').next().unwrap();
    let event = line.split(": ").nth(1).unwrap();
    (tid, event)
}

/// The value of `name=` in a trace line.
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let at = line
        .find(&format!(" {name}="))
        .unwrap_or_else(|| panic!("no {name} in {line}"));
    line[at + name.len() + 2..]
        .split_whitespace()
        .next()
        .unwrap()
}

#[test]
fn callsites_of_two_crates_are_enabled_filtered_and_triggered() {
    let _serial = setup();
    let mut service = Service::start();
    service.load(1, 20);
    let available = available();
    for event in [
        "shop_api:served",
        "shop_api:handle_enter",
        "shop_api:handle_exit",
        "shop_api:lookup_enter",
        "shop_server:connection_enter",
        "shop_server:connection_exit",
        "tokio_runtime:round",
    ] {
        assert!(
            available.lines().any(|l| l == event),
            "{event} missing from available_events:\n{available}"
        );
    }

    let t = Instance::new("tokio_filter");
    t.write(
        "events/shop_api/served/filter",
        "status >= 500 && path_str ~ \"/api/*\"",
    );
    t.write(
        "events/shop_api/served/trigger",
        "stacktrace if status == 503",
    );
    t.write("events/shop_api/served/enable", "1");
    // A filter on a span's field: only the handling of static files.
    t.write(
        "events/shop_api/handle_enter/filter",
        "path_str ~ \"/static/*\"",
    );
    t.write("events/shop_api/handle_enter/enable", "1");
    t.write("events/tokio_runtime/round/enable", "1");
    let statuses = service.load(4, 50);
    let failed = statuses.iter().filter(|s| **s == 503).count();
    let statics = (0..200).filter(|i| shop::server::request(1 + i).contains("/static/"));
    assert!(failed > 0, "the load has 503s: {statuses:?}");

    let lines = t.lines();
    let served: Vec<&String> = lines.iter().filter(|l| l.contains(" served: ")).collect();
    assert_eq!(served.len(), failed, "{lines:#?}");
    assert!(
        served
            .iter()
            .all(|l| l.contains("served: INFO request done status=503 path=/api/item/")),
        "{served:#?}"
    );
    let stacks: Vec<usize> = (0..lines.len())
        .filter(|i| lines[*i].ends_with("<stack trace>"))
        .collect();
    assert_eq!(stacks.len(), failed, "one stack per 503:\n{lines:#?}");
    for at in stacks {
        // Entries of other threads (other CPUs' buffers) may come between an event and
        // its stack: the event is the thread's entry before.
        let (tid, _) = task_and_event(&lines[at]);
        let event = lines[..at]
            .iter()
            .rev()
            .find(|l| !l.starts_with(" => ") && task_and_event(l).0 == tid)
            .expect("the stack's event");
        assert!(event.contains("status=503"), "{event}");
        let frames: Vec<&String> = lines[at + 1..]
            .iter()
            .take_while(|l| l.starts_with(" => "))
            .collect();
        assert!(
            frames.iter().any(|f| f.contains(" shop::")),
            "the service is on the stack of {event}: {frames:#?}"
        );
    }
    let entered: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains(" handle_enter: "))
        .collect();
    assert!(
        entered.len() >= statics.count(),
        "every static request entered its handler at least once: {entered:#?}"
    );
    assert!(
        entered
            .iter()
            .all(|l| field(l, "path").starts_with("/static/") && field(l, "method") == "GET"),
        "{entered:#?}"
    );
    let rounds: Vec<&String> = lines.iter().filter(|l| l.contains(" round: ")).collect();
    assert_eq!(rounds.len(), 1, "{lines:#?}");
    assert!(
        rounds[0].contains("round: INFO conns=4 per_conn=50"),
        "{}",
        rounds[0]
    );
}

#[test]
fn a_callsite_turned_off_stops_reaching_the_subscriber() {
    let _serial = setup();
    let mut service = Service::start();
    // Registers the callsites; nothing enables them.
    service.load(1, 20);
    let t = Instance::new("tokio_off");
    let before = (
        SERVED_REACHED.load(Ordering::SeqCst),
        HANDLE_REACHED.load(Ordering::SeqCst),
    );
    service.load(2, 20);
    assert_eq!(
        (
            SERVED_REACHED.load(Ordering::SeqCst),
            HANDLE_REACHED.load(Ordering::SeqCst)
        ),
        before,
        "a disabled callsite's interest is `never`: tracing does not call the subscriber"
    );

    t.write("events/shop_api/served/enable", "1");
    t.write("events/shop_api/handle_exit/enable", "1");
    service.load(2, 20);
    assert_eq!(SERVED_REACHED.load(Ordering::SeqCst) - before.0, 40);
    assert_eq!(HANDLE_REACHED.load(Ordering::SeqCst) - before.1, 40);
    let lines = t.lines();
    assert_eq!(
        lines.iter().filter(|l| l.contains(" served: ")).count(),
        40,
        "{lines:#?}"
    );

    t.write("events/shop_api/served/enable", "0");
    t.write("events/shop_api/handle_exit/enable", "0");
    let after = (
        SERVED_REACHED.load(Ordering::SeqCst),
        HANDLE_REACHED.load(Ordering::SeqCst),
    );
    service.load(2, 20);
    assert_eq!(
        (
            SERVED_REACHED.load(Ordering::SeqCst),
            HANDLE_REACHED.load(Ordering::SeqCst)
        ),
        after,
        "disabled again, the interest is `never` again"
    );
    assert_eq!(t.lines().len(), lines.len(), "nothing recorded while off");
}

#[test]
fn spans_pair_up_while_tasks_move_between_workers() {
    let _serial = setup();
    let mut service = Service::start();
    service.load(1, 20);
    let t = Instance::new("tokio_spans");
    for event in [
        "shop_server/connection_enter",
        "shop_server/connection_exit",
        "shop_api/handle_enter",
        "shop_api/handle_exit",
        "shop_api/lookup_enter",
        "shop_api/lookup_exit",
    ] {
        t.write(&format!("events/{event}/enable"), "1");
    }
    // Work stealing decides where a woken task runs: load until some connection's span
    // was entered on two workers (almost always the first round).
    let mut requests = 0;
    let mut lines = Vec::new();
    for _ in 0..20 {
        requests += service.load(8, 25).len();
        lines = t.lines();
        let mut workers: HashMap<&str, HashSet<&str>> = HashMap::new();
        for line in lines.iter().filter(|l| l.contains(" connection_enter: ")) {
            let (tid, _) = task_and_event(line);
            workers.entry(field(line, "conn")).or_default().insert(tid);
        }
        if workers.values().any(|w| w.len() > 1) {
            break;
        }
    }

    // The server's last poll of a connection (its span's exit) may end after the client
    // has its answer: read again until every thread's spans are closed.
    let mut open = 0;
    for _ in 0..100 {
        open = pairs(&lines).2.values().map(Vec::len).sum::<usize>();
        if open == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        lines = t.lines();
    }
    let (handled, moved, stacks) = pairs(&lines);
    assert_eq!(open, 0, "entered and never exited: {stacks:?}");
    assert!(
        handled >= requests,
        "{handled} handler polls for {requests} requests"
    );
    assert!(stacks.len() > 1, "the load ran on one thread only");
    assert!(
        moved.values().any(|w| w.len() > 1),
        "no connection task moved to another worker in 20 rounds"
    );
}

/// Spans per thread still open after `lines`, keyed by thread id. On each thread spans are
/// entered and exited as a stack (a poll runs on one thread, nested spans inside it), and
/// every exit must name the span its enter did. Also: how many `handle` spans exited, and
/// on which threads each connection (its `conn` field) was entered.
#[allow(clippy::type_complexity)]
fn pairs(
    lines: &[String],
) -> (
    usize,
    HashMap<&str, HashSet<&str>>,
    HashMap<&str, Vec<(String, &str)>>,
) {
    let mut stacks: HashMap<&str, Vec<(String, &str)>> = HashMap::new();
    let mut moved: HashMap<&str, HashSet<&str>> = HashMap::new();
    let mut handled = 0;
    for line in lines {
        let (tid, event) = task_and_event(line);
        let id = field(line, "span_id");
        let stack = stacks.entry(tid).or_default();
        if let Some(name) = event.strip_suffix("_enter") {
            stack.push((name.to_string(), id));
            if name == "connection" {
                moved.entry(field(line, "conn")).or_default().insert(tid);
            }
        } else {
            let name = event.strip_suffix("_exit").unwrap();
            assert_eq!(
                stack.pop(),
                Some((name.to_string(), id)),
                "unpaired exit on thread {tid}: {line}"
            );
            if name == "handle" {
                handled += 1;
            }
        }
    }
    (handled, moved, stacks)
}
