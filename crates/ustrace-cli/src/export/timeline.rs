//! What the exporters agree on about a recorded trace: its threads and processes, which
//! events open and close slices (fprobe entry/exit pairs), and which fields feed counters.
//!
//! A trace is read twice. The first pass ([`Scan`]) learns every thread (its comm and
//! thread group), which functions have an exit probe anywhere in the trace, and which
//! processes carry each asked-for counter, so the Perfetto and Chrome writers can declare
//! their tracks before the first event. The second pass ([`Timeline::step`]) turns each
//! event, in timestamp order, into a [`Step`]: an instant, the beginning of a slice, or the
//! end of one or more, plus the counter samples it carries. Both formats are written from
//! the same steps, so they cannot disagree about what is a slice.

use std::collections::{BTreeMap, HashMap, HashSet};
use ustrace_tracedat::{Event, Value};

/// A thread seen in the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    pub tid: i32,
    /// Its thread group (process id); the thread's own id when the trace does not say.
    pub tgid: i32,
    /// From the trace's saved_cmdlines (`<...>` when it was not saved).
    pub comm: String,
}

/// A process: the thread group of one or more threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: i32,
    /// The comm of its main thread, or of its first thread when the main one left no event.
    pub name: String,
}

/// A numeric field drawn as a counter, as `--counter SYS:EVENT:FIELD` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSpec {
    pub system: String,
    pub event: String,
    pub field: String,
}

impl CounterSpec {
    /// Parses `SYS:EVENT:FIELD` (a `/` may separate the system from the event too).
    pub fn parse(text: &str) -> Result<CounterSpec, String> {
        let bad = || {
            format!(
                "--counter `{text}`: name the field as SYSTEM:EVENT:FIELD (e.g. kv:get:latency_ns)"
            )
        };
        let (event, field) = text.rsplit_once(':').ok_or_else(bad)?;
        let (system, event) = event
            .split_once(':')
            .or_else(|| event.split_once('/'))
            .ok_or_else(bad)?;
        let ok = |s: &str| !s.is_empty() && !s.contains([':', '/', ' ']);
        if !ok(system) || !ok(event) || !ok(field) {
            return Err(bad());
        }
        Ok(CounterSpec {
            system: system.to_owned(),
            event: event.to_owned(),
            field: field.to_owned(),
        })
    }

    fn matches(&self, ev: &Event) -> bool {
        ev.name == self.event && ev.system == self.system
    }

    /// `SYS:EVENT:FIELD`, the counter track's name.
    pub fn label(&self) -> String {
        format!("{}:{}:{}", self.system, self.event, self.field)
    }
}

/// A counter track: one asked-for field in one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterTrack {
    /// Index into the `--counter` list.
    pub spec: usize,
    pub pid: i32,
}

/// A counter sample's value, integral when the field is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    Int(i64),
    /// An unsigned value too large for an `i64`.
    Float(f64),
}

/// What one event is on the timeline.
#[derive(Debug, Clone, PartialEq)]
pub enum Mark {
    /// A point in time on its thread's track.
    Instant,
    /// An entry probe whose function has an exit probe: a slice named so opens.
    Begin(String),
    /// An exit probe closing the slices named here, innermost first. More than one when
    /// the exits of calls nested inside were lost (or never probed on this path); the
    /// event's fields belong to the last, the call it returned from.
    End(Vec<String>),
}

/// One event on the timeline, for the writers.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Events of this CPU lost just before this one, as the page said: `Some(n)` with
    /// n > 0, or `Some(-1)` when some were lost but the count was not kept.
    pub lost: Option<i64>,
    pub mark: Mark,
    /// `(index into Scan::counter_tracks, value)` for each counter this event feeds.
    pub counters: Vec<(usize, Num)>,
}

/// What identifies the function of an entry or exit probe.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    /// The function's address: an entry probe's `__probe_ip`, an exit probe's `__probe_func`.
    Func(u64),
    /// `SYS` and `NAME` of events named `NAME__entry` / `NAME__exit` without probe fields.
    Name(String, String),
}

fn field<'e>(ev: &'e Event, name: &str) -> Option<&'e Value> {
    ev.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v)
}

fn addr(v: &Value) -> Option<u64> {
    match v {
        Value::UInt(u) => Some(*u),
        Value::Int(i) => Some(*i as u64),
        _ => None,
    }
}

/// The function an entry probe fired for: its `__probe_ip` (fprobes, kprobes, uprobes
/// record the probed address there), else the `NAME` of an event named `NAME__entry`.
fn entry_key(ev: &Event) -> Option<Key> {
    // An exit probe has no `__probe_ip`; a probe on a return site has `__probe_func` too.
    if field(ev, "__probe_func").is_some() {
        return None;
    }
    if let Some(ip) = field(ev, "__probe_ip").and_then(addr) {
        return Some(Key::Func(ip));
    }
    let base = ev.name.strip_suffix("__entry")?;
    Some(Key::Name(ev.system.clone(), base.to_owned()))
}

/// The function an exit probe fired for: its `__probe_func` (the entry address of the
/// function returning), else the `NAME` of an event named `NAME__exit`.
fn exit_key(ev: &Event) -> Option<Key> {
    if let Some(func) = field(ev, "__probe_func").and_then(addr) {
        return Some(Key::Func(func));
    }
    if field(ev, "__probe_ip").is_some() {
        return None;
    }
    let base = ev.name.strip_suffix("__exit")?;
    Some(Key::Name(ev.system.clone(), base.to_owned()))
}

/// The slice an entry opens is named after its event, less the `__entry` that ustrace and
/// the kernel add to a probe's default name (`f:grp/read_slow read` stays `read_slow`).
fn slice_name(ev: &Event) -> String {
    ev.name
        .strip_suffix("__entry")
        .unwrap_or(&ev.name)
        .to_owned()
}

/// A field's value as a counter sample, `None` when the field is not a number.
fn number(v: &Value) -> Option<Num> {
    match v {
        Value::Int(i) => Some(Num::Int(*i)),
        Value::UInt(u) => Some(match i64::try_from(*u) {
            Ok(i) => Num::Int(i),
            Err(_) => Num::Float(*u as f64),
        }),
        _ => None,
    }
}

/// The first pass over a trace.
#[derive(Debug, Default)]
pub struct Scan {
    /// Every thread that wrote an event, by thread id.
    pub threads: BTreeMap<i32, Thread>,
    /// The thread groups of those threads, by process id.
    pub processes: BTreeMap<i32, Process>,
    /// The counter tracks to declare, in the order first seen.
    pub counter_tracks: Vec<CounterTrack>,
    /// The CPUs whose buffers lost events, each drawn on a track of its own.
    pub lossy_cpus: std::collections::BTreeSet<u32>,
    counter_index: HashMap<(usize, i32), usize>,
    /// Functions with at least one exit probe event in the trace.
    exits: HashSet<Key>,
    counters: Vec<CounterSpec>,
    /// For each counter spec: whether any event of its name had the field, and whether
    /// that field was not a number (then it is an error, said once).
    seen: Vec<(bool, Option<String>)>,
}

impl Scan {
    /// A scan that will look for the fields of `counters`.
    pub fn new(counters: Vec<CounterSpec>) -> Scan {
        let seen = vec![(false, None); counters.len()];
        Scan {
            counters,
            seen,
            ..Scan::default()
        }
    }

    /// Learns from one event of the first pass.
    pub fn add(&mut self, ev: &Event) {
        let tgid = ev.tgid.unwrap_or(ev.pid);
        self.threads.entry(ev.pid).or_insert_with(|| Thread {
            tid: ev.pid,
            tgid,
            comm: ev.comm.clone(),
        });
        let process = self.processes.entry(tgid).or_insert_with(|| Process {
            pid: tgid,
            name: ev.comm.clone(),
        });
        if ev.pid == tgid {
            process.name.clone_from(&ev.comm);
        }
        if let Some(key) = exit_key(ev) {
            self.exits.insert(key);
        }
        if ev.missed_events != 0 {
            self.lossy_cpus.insert(ev.cpu);
        }
        for (i, spec) in self.counters.iter().enumerate() {
            if !spec.matches(ev) {
                continue;
            }
            let Some(v) = field(ev, &spec.field) else {
                continue;
            };
            self.seen[i].0 = true;
            if number(v).is_none() {
                self.seen[i].1.get_or_insert_with(|| {
                    format!(
                        "--counter {}: the field is not a number (a string or an array)",
                        spec.label()
                    )
                });
                continue;
            }
            let tracks = &mut self.counter_tracks;
            self.counter_index.entry((i, tgid)).or_insert_with(|| {
                tracks.push(CounterTrack { spec: i, pid: tgid });
                tracks.len() - 1
            });
        }
    }

    /// The asked-for counters, in `--counter` order.
    pub fn counters(&self) -> &[CounterSpec] {
        &self.counters
    }

    /// After the first pass: an error for a counter field that is not a number, and a
    /// warning for each counter no event of the trace carried (an event that never fired
    /// is not a mistake, a misspelt one may be).
    pub fn check(&self) -> Result<Vec<String>, String> {
        let mut warnings = Vec::new();
        for (spec, (seen, err)) in self.counters.iter().zip(&self.seen) {
            if let Some(e) = err {
                return Err(e.clone());
            }
            if !seen {
                warnings.push(format!(
                    "--counter {}: no `{}:{}` event with a field `{}` in the trace",
                    spec.label(),
                    spec.system,
                    spec.event,
                    spec.field
                ));
            }
        }
        Ok(warnings)
    }
}

/// The second pass: the slices open on each thread.
#[derive(Debug)]
pub struct Timeline<'s> {
    scan: &'s Scan,
    open: HashMap<i32, Vec<(Key, String)>>,
}

impl<'s> Timeline<'s> {
    /// A timeline over the trace `scan` has read.
    pub fn new(scan: &'s Scan) -> Timeline<'s> {
        Timeline {
            scan,
            open: HashMap::new(),
        }
    }

    /// What `ev` is on the timeline; events must come in timestamp order.
    pub fn step(&mut self, ev: &Event) -> Step {
        let mark = self.mark(ev);
        let mut counters = Vec::new();
        let tgid = ev.tgid.unwrap_or(ev.pid);
        for (i, spec) in self.scan.counters.iter().enumerate() {
            if !spec.matches(ev) {
                continue;
            }
            let Some(n) = field(ev, &spec.field).and_then(number) else {
                continue;
            };
            if let Some(&track) = self.scan.counter_index.get(&(i, tgid)) {
                counters.push((track, n));
            }
        }
        let lost = (ev.missed_events != 0).then_some(ev.missed_events);
        Step {
            lost,
            mark,
            counters,
        }
    }

    fn mark(&mut self, ev: &Event) -> Mark {
        if let Some(key) = exit_key(ev) {
            let stack = self.open.entry(ev.pid).or_default();
            // An exit whose entry is not open on this thread (it came before the trace
            // began, or was lost) stays an instant: ending some other slice would lie.
            if let Some(depth) = stack.iter().rposition(|(k, _)| *k == key) {
                let names = stack.drain(depth..).rev().map(|(_, name)| name).collect();
                return Mark::End(names);
            }
            return Mark::Instant;
        }
        if let Some(key) = entry_key(ev) {
            // Only a function that returns somewhere in the trace opens slices; entries of
            // one probed without its exit are points in time, not slices that never end.
            if self.scan.exits.contains(&key) {
                let name = slice_name(ev);
                self.open
                    .entry(ev.pid)
                    .or_default()
                    .push((key, name.clone()));
                return Mark::Begin(name);
            }
        }
        Mark::Instant
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An event for the tests: `fields` as `(name, value)`.
    pub fn ev(ts: u64, pid: i32, sys: &str, name: &str, fields: Vec<(&str, Value)>) -> Event {
        Event {
            cpu: 0,
            ts,
            pid,
            tgid: Some(100),
            comm: format!("t{pid}"),
            id: 1,
            system: sys.to_owned(),
            name: name.to_owned(),
            flags: 0,
            preempt: 0,
            fields: fields.into_iter().map(|(n, v)| (n.to_owned(), v)).collect(),
            missed_events: 0,
            data: Vec::new(),
        }
    }

    pub fn entry(ts: u64, pid: i32, name: &str, func: u64) -> Event {
        ev(
            ts,
            pid,
            "fprobes",
            name,
            vec![("__probe_ip", Value::UInt(func))],
        )
    }

    pub fn exit(ts: u64, pid: i32, name: &str, func: u64) -> Event {
        ev(
            ts,
            pid,
            "fprobes",
            name,
            vec![
                ("__probe_func", Value::UInt(func)),
                ("__probe_ret_ip", Value::UInt(0x99)),
            ],
        )
    }

    fn run(events: &[Event], counters: Vec<CounterSpec>) -> (Scan, Vec<Step>) {
        let mut scan = Scan::new(counters);
        for e in events {
            scan.add(e);
        }
        let steps = {
            let mut t = Timeline::new(&scan);
            events.iter().map(|e| t.step(e)).collect()
        };
        (scan, steps)
    }

    #[test]
    fn entry_exit_pairs_nest_per_thread_by_function_address() {
        let events = [
            entry(1, 1, "outer__entry", 0x10),
            entry(2, 2, "outer__entry", 0x10),
            // A user-named pair: matched by address, named after the entry.
            entry(3, 1, "inner", 0x20),
            exit(4, 1, "inner_ret", 0x20),
            exit(5, 2, "outer__exit", 0x10),
            exit(6, 1, "outer__exit", 0x10),
        ];
        let (_, steps) = run(&events, vec![]);
        let marks: Vec<Mark> = steps.into_iter().map(|s| s.mark).collect();
        assert_eq!(
            marks,
            vec![
                Mark::Begin("outer".into()),
                Mark::Begin("outer".into()),
                Mark::Begin("inner".into()),
                Mark::End(vec!["inner".into()]),
                Mark::End(vec!["outer".into()]),
                Mark::End(vec!["outer".into()]),
            ]
        );
    }

    #[test]
    fn unpaired_probes_stay_instants_and_lost_exits_close_inner_slices() {
        let events = [
            // No exit probe for 0x30 anywhere: an instant.
            entry(1, 1, "lonely__entry", 0x30),
            // The exit of a call entered before the trace began.
            exit(2, 1, "early__exit", 0x40),
            entry(3, 1, "a__entry", 0x50),
            entry(4, 1, "b__entry", 0x60),
            // b's exit was lost: a's exit closes both.
            exit(5, 1, "a__exit", 0x50),
            exit(6, 1, "b__exit", 0x60),
        ];
        let (_, steps) = run(&events, vec![]);
        let marks: Vec<Mark> = steps.into_iter().map(|s| s.mark).collect();
        assert_eq!(
            marks,
            vec![
                Mark::Instant,
                Mark::Instant,
                Mark::Begin("a".into()),
                Mark::Begin("b".into()),
                Mark::End(vec!["b".into(), "a".into()]),
                Mark::Instant,
            ]
        );
    }

    #[test]
    fn events_named_entry_and_exit_without_probe_fields_pair_by_name() {
        let events = [
            ev(1, 1, "app", "load__entry", vec![]),
            ev(2, 1, "app", "load__exit", vec![]),
            ev(3, 1, "other", "load__exit", vec![]),
        ];
        let (_, steps) = run(&events, vec![]);
        let marks: Vec<Mark> = steps.into_iter().map(|s| s.mark).collect();
        assert_eq!(
            marks,
            vec![
                Mark::Begin("load".into()),
                Mark::End(vec!["load".into()]),
                Mark::Instant
            ]
        );
    }

    #[test]
    fn counters_take_numeric_fields_per_process_and_refuse_strings() {
        let spec = CounterSpec::parse("kv:get:latency_ns").unwrap();
        let mut other = ev(
            2,
            7,
            "kv",
            "get",
            vec![("latency_ns", Value::UInt(u64::MAX))],
        );
        other.tgid = Some(7);
        let events = [
            ev(1, 1, "kv", "get", vec![("latency_ns", Value::UInt(42))]),
            other,
            ev(3, 2, "kv", "put", vec![("latency_ns", Value::UInt(5))]),
        ];
        let (scan, steps) = run(&events, vec![spec]);
        assert_eq!(
            scan.counter_tracks,
            vec![
                CounterTrack { spec: 0, pid: 100 },
                CounterTrack { spec: 0, pid: 7 }
            ]
        );
        assert_eq!(steps[0].counters, vec![(0, Num::Int(42))]);
        assert_eq!(steps[1].counters, vec![(1, Num::Float(u64::MAX as f64))]);
        assert!(steps[2].counters.is_empty());
        assert!(scan.check().unwrap().is_empty());

        let (scan, _) = run(
            &[ev(1, 1, "kv", "get", vec![("key", Value::Str("a".into()))])],
            vec![CounterSpec::parse("kv/get:key").unwrap()],
        );
        assert!(scan.check().unwrap_err().contains("not a number"));
        let (scan, _) = run(&[], vec![CounterSpec::parse("kv:get:nope").unwrap()]);
        assert_eq!(scan.check().unwrap().len(), 1);
        for bad in ["kv:get", "kv", ":get:x", "kv:get:", "kv:get:a b"] {
            assert!(CounterSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lost_events_are_marked_on_the_event_after_them() {
        let mut after = ev(2, 1, "kv", "get", vec![]);
        after.missed_events = 5;
        after.cpu = 3;
        let (scan, steps) = run(&[ev(1, 1, "kv", "get", vec![]), after], vec![]);
        assert_eq!(scan.lossy_cpus.iter().copied().collect::<Vec<_>>(), vec![3]);
        assert_eq!(
            steps.iter().map(|s| s.lost).collect::<Vec<_>>(),
            vec![None, Some(5)]
        );
    }

    #[test]
    fn threads_and_processes_take_names_from_the_main_thread() {
        let mut a = ev(1, 101, "kv", "get", vec![]);
        a.comm = "worker".into();
        let mut b = ev(2, 100, "kv", "get", vec![]);
        b.comm = "server".into();
        let (scan, _) = run(&[a, b], vec![]);
        assert_eq!(scan.processes[&100].name, "server");
        assert_eq!(scan.threads[&101].comm, "worker");
        assert_eq!(scan.threads[&101].tgid, 100);
    }
}
