//! `ustrace export --perfetto`: a Perfetto trace (a `Trace` message: length-delimited
//! `TracePacket`s) of TrackEvents, as ui.perfetto.dev and its trace processor read it.
//!
//! One packet sequence holds everything. Descriptor packets come first: a process track
//! per thread group, a thread track per thread under it (names from the trace's
//! saved_cmdlines), a counter track per asked-for field and process, and a track per CPU
//! whose buffer lost events. Then one packet per event in timestamp order: an instant on
//! its thread's track, or a slice begin/end for fprobe entry/exit pairs (see
//! [`super::timeline`]), with the event's fields as debug annotations; before it an instant
//! on its CPU's track if events were lost just before it, after it a counter packet per
//! counter it feeds. Event names, systems (categories) and field names are interned:
//! written once, then referred to by id. Field numbers are those of Perfetto's
//! protos/perfetto/trace/{trace_packet,interned_data/*,track_event/*}.proto.

use super::protobuf::Msg;
use super::timeline::{Mark, Num, Scan, Step, Timeline};
use super::Events;
use std::collections::HashMap;
use std::io::{self, Write};
use ustrace_tracedat::{Event, Value};

// TracePacket
const PACKET_TIMESTAMP: u32 = 8;
const PACKET_SEQUENCE_ID: u32 = 10;
const PACKET_TRACK_EVENT: u32 = 11;
const PACKET_INTERNED_DATA: u32 = 12;
const PACKET_SEQUENCE_FLAGS: u32 = 13;
const PACKET_TRACK_DESCRIPTOR: u32 = 60;
/// `TracePacket.SequenceFlags`: the first packet says the sequence starts with no interned
/// names; every event packet says it refers to names interned before it.
const SEQ_INCREMENTAL_STATE_CLEARED: u64 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u64 = 2;
// InternedData and its EventName / EventCategory / DebugAnnotationName entries
const INTERNED_EVENT_CATEGORIES: u32 = 1;
const INTERNED_EVENT_NAMES: u32 = 2;
const INTERNED_ANNOTATION_NAMES: u32 = 3;
const INTERNED_IID: u32 = 1;
const INTERNED_NAME: u32 = 2;
// TrackDescriptor
const TRACK_UUID: u32 = 1;
const TRACK_NAME: u32 = 2;
const TRACK_PROCESS: u32 = 3;
const TRACK_THREAD: u32 = 4;
const TRACK_PARENT_UUID: u32 = 5;
const TRACK_COUNTER: u32 = 8;
// ProcessDescriptor / ThreadDescriptor
const PROCESS_PID: u32 = 1;
const PROCESS_NAME: u32 = 6;
const THREAD_PID: u32 = 1;
const THREAD_TID: u32 = 2;
const THREAD_NAME: u32 = 5;
// TrackEvent
const EVENT_CATEGORY_IIDS: u32 = 3;
const EVENT_ANNOTATIONS: u32 = 4;
const EVENT_TYPE: u32 = 9;
const EVENT_NAME_IID: u32 = 10;
const EVENT_TRACK_UUID: u32 = 11;
const EVENT_COUNTER_VALUE: u32 = 30;
const EVENT_DOUBLE_COUNTER_VALUE: u32 = 44;
const TYPE_SLICE_BEGIN: u64 = 1;
const TYPE_SLICE_END: u64 = 2;
const TYPE_INSTANT: u64 = 3;
const TYPE_COUNTER: u64 = 4;
// DebugAnnotation
const ANN_NAME_IID: u32 = 1;
const ANN_UINT: u32 = 3;
const ANN_INT: u32 = 4;
const ANN_STRING: u32 = 6;
const ANN_ARRAY: u32 = 12;

/// The one packet sequence of the file.
const SEQUENCE: u64 = 1;

/// Track uuids only need to be unique in the file; the high bits keep the kinds apart.
fn process_uuid(pid: i32) -> u64 {
    1 << 40 | u64::from(pid as u32)
}
fn thread_uuid(tid: i32) -> u64 {
    2 << 40 | u64::from(tid as u32)
}
fn counter_uuid(index: usize) -> u64 {
    3 << 40 | index as u64
}
fn lost_uuid(cpu: u32) -> u64 {
    4 << 40 | u64::from(cpu)
}

/// How many packets of each kind a write produced (the summary line).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub events: u64,
    pub slices: u64,
    pub counters: u64,
    pub tracks: u64,
}

fn packet() -> Msg {
    let mut p = Msg::new();
    p.uint(PACKET_SEQUENCE_ID, SEQUENCE);
    p
}

/// Writes `p` as one `Trace.packet` (field 1).
fn emit(out: &mut dyn Write, p: &Msg) -> io::Result<()> {
    let mut frame = Msg::new();
    frame.message(1, p);
    out.write_all(frame.as_bytes())
}

/// Names said once per file: event names, categories (systems) and annotation names go in
/// a packet's `interned_data` the first time they are used and by id after that, so a
/// trace of a million `get` events does not carry "latency_ns" a million times.
#[derive(Default)]
struct Interner {
    names: HashMap<String, u64>,
    categories: HashMap<String, u64>,
    annotations: HashMap<String, u64>,
    /// The `InternedData` of the packet being built: what it uses for the first time.
    pending: Msg,
}

impl Interner {
    fn intern(table: &mut HashMap<String, u64>, pending: &mut Msg, field: u32, s: &str) -> u64 {
        if let Some(&iid) = table.get(s) {
            return iid;
        }
        // iid 0 is not a valid id.
        let iid = table.len() as u64 + 1;
        table.insert(s.to_owned(), iid);
        let mut entry = Msg::new();
        entry.uint(INTERNED_IID, iid).str(INTERNED_NAME, s);
        pending.message(field, &entry);
        iid
    }

    fn name(&mut self, s: &str) -> u64 {
        Self::intern(&mut self.names, &mut self.pending, INTERNED_EVENT_NAMES, s)
    }

    fn category(&mut self, s: &str) -> u64 {
        Self::intern(
            &mut self.categories,
            &mut self.pending,
            INTERNED_EVENT_CATEGORIES,
            s,
        )
    }

    fn annotation(&mut self, s: &str) -> u64 {
        Self::intern(
            &mut self.annotations,
            &mut self.pending,
            INTERNED_ANNOTATION_NAMES,
            s,
        )
    }

    /// A timed packet around `te`, carrying what `te` interned for the first time.
    fn packet(&mut self, ts: u64, te: &Msg) -> Msg {
        let mut p = packet();
        p.uint(PACKET_TIMESTAMP, ts)
            .message(PACKET_TRACK_EVENT, te)
            .uint(PACKET_SEQUENCE_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE);
        let pending = std::mem::take(&mut self.pending);
        if !pending.as_bytes().is_empty() {
            p.message(PACKET_INTERNED_DATA, &pending);
        }
        p
    }
}

fn annotation(interner: &mut Interner, name: Option<&str>, v: &Value) -> Msg {
    let mut a = Msg::new();
    if let Some(name) = name {
        a.uint(ANN_NAME_IID, interner.annotation(name));
    }
    match v {
        Value::Int(i) => {
            a.int(ANN_INT, *i);
        }
        Value::UInt(u) => {
            a.uint(ANN_UINT, *u);
        }
        Value::Str(s) => {
            a.str(ANN_STRING, s);
        }
        Value::Bytes(b) => {
            a.str(ANN_STRING, &super::hex(b));
        }
        Value::Array(items) => {
            for item in items {
                a.message(ANN_ARRAY, &annotation(interner, None, &Value::UInt(*item)));
            }
        }
    }
    a
}

fn track_event(
    interner: &mut Interner,
    ev: &Event,
    kind: u64,
    name: Option<&str>,
    args: bool,
) -> Msg {
    let mut te = Msg::new();
    te.uint(EVENT_TYPE, kind)
        .uint(EVENT_TRACK_UUID, thread_uuid(ev.pid));
    if let Some(name) = name {
        te.uint(EVENT_NAME_IID, interner.name(name))
            .uint(EVENT_CATEGORY_IIDS, interner.category(&ev.system));
    }
    if args {
        let cpu = annotation(
            interner,
            Some("common_cpu"),
            &Value::UInt(u64::from(ev.cpu)),
        );
        te.message(EVENT_ANNOTATIONS, &cpu);
        for (name, v) in &ev.fields {
            let a = annotation(interner, Some(name), v);
            te.message(EVENT_ANNOTATIONS, &a);
        }
    }
    te
}

fn descriptors(out: &mut dyn Write, scan: &Scan, counts: &mut Counts) -> io::Result<()> {
    let mut first = true;
    let mut track = |out: &mut dyn Write, td: &Msg| {
        let mut p = packet();
        if std::mem::take(&mut first) {
            p.uint(PACKET_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED);
        }
        p.message(PACKET_TRACK_DESCRIPTOR, td);
        counts.tracks += 1;
        emit(out, &p)
    };
    for proc in scan.processes.values() {
        let mut pd = Msg::new();
        pd.int(PROCESS_PID, i64::from(proc.pid))
            .str(PROCESS_NAME, &proc.name);
        let mut td = Msg::new();
        td.uint(TRACK_UUID, process_uuid(proc.pid))
            .message(TRACK_PROCESS, &pd);
        track(out, &td)?;
    }
    for t in scan.threads.values() {
        let mut thd = Msg::new();
        thd.int(THREAD_PID, i64::from(t.tgid))
            .int(THREAD_TID, i64::from(t.tid))
            .str(THREAD_NAME, &t.comm);
        let mut td = Msg::new();
        td.uint(TRACK_UUID, thread_uuid(t.tid))
            .uint(TRACK_PARENT_UUID, process_uuid(t.tgid))
            .message(TRACK_THREAD, &thd);
        track(out, &td)?;
    }
    for (i, c) in scan.counter_tracks.iter().enumerate() {
        let mut td = Msg::new();
        td.uint(TRACK_UUID, counter_uuid(i))
            .uint(TRACK_PARENT_UUID, process_uuid(c.pid))
            .str(TRACK_NAME, &scan.counters()[c.spec].label())
            .message(TRACK_COUNTER, &Msg::new());
        track(out, &td)?;
    }
    for cpu in &scan.lossy_cpus {
        let mut td = Msg::new();
        td.uint(TRACK_UUID, lost_uuid(*cpu))
            .str(TRACK_NAME, &format!("cpu{cpu} lost events"));
        track(out, &td)?;
    }
    Ok(())
}

/// An instant on the CPU's lost-events track: events of that buffer were overwritten or
/// dropped between the previous event and this one.
fn lost(out: &mut dyn Write, interner: &mut Interner, ev: &Event, count: i64) -> io::Result<()> {
    let mut te = Msg::new();
    te.uint(EVENT_TYPE, TYPE_INSTANT)
        .uint(EVENT_TRACK_UUID, lost_uuid(ev.cpu))
        .uint(EVENT_NAME_IID, interner.name("lost events"));
    let value = if count > 0 {
        Value::Int(count)
    } else {
        Value::Str("unknown".into())
    };
    let a = annotation(interner, Some("count"), &value);
    te.message(EVENT_ANNOTATIONS, &a);
    let p = interner.packet(ev.ts, &te);
    emit(out, &p)
}

fn event(
    out: &mut dyn Write,
    interner: &mut Interner,
    ev: &Event,
    step: &Step,
    counts: &mut Counts,
) -> io::Result<()> {
    counts.events += 1;
    if let Some(count) = step.lost {
        lost(out, interner, ev, count)?;
    }
    match &step.mark {
        Mark::Instant => {
            let te = track_event(interner, ev, TYPE_INSTANT, Some(&ev.name), true);
            emit(out, &interner.packet(ev.ts, &te))?;
        }
        Mark::Begin(name) => {
            counts.slices += 1;
            let te = track_event(interner, ev, TYPE_SLICE_BEGIN, Some(name), true);
            emit(out, &interner.packet(ev.ts, &te))?;
        }
        Mark::End(names) => {
            // Slices whose exits were lost end here too, without the exit's fields.
            for i in 0..names.len() {
                let last = i + 1 == names.len();
                let te = track_event(interner, ev, TYPE_SLICE_END, None, last);
                emit(out, &interner.packet(ev.ts, &te))?;
            }
        }
    }
    for (track, value) in &step.counters {
        counts.counters += 1;
        let mut te = Msg::new();
        te.uint(EVENT_TYPE, TYPE_COUNTER)
            .uint(EVENT_TRACK_UUID, counter_uuid(*track));
        match value {
            Num::Int(i) => te.int(EVENT_COUNTER_VALUE, *i),
            Num::Float(f) => te.double(EVENT_DOUBLE_COUNTER_VALUE, *f),
        };
        emit(out, &interner.packet(ev.ts, &te))?;
    }
    Ok(())
}

/// Writes the Perfetto trace of `events`, which `scan` has read in a first pass.
pub fn write(out: &mut dyn Write, scan: &Scan, events: &dyn Events) -> io::Result<Counts> {
    let mut counts = Counts::default();
    descriptors(out, scan, &mut counts)?;
    let mut timeline = Timeline::new(scan);
    let mut interner = Interner::default();
    events.for_each(&mut |ev| {
        let step = timeline.step(ev);
        event(out, &mut interner, ev, &step, &mut counts)
    })?;
    Ok(counts)
}
