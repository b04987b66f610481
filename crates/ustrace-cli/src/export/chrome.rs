//! `ustrace export --chrome`: the Chrome trace event format (`{"traceEvents":[...]}`), which
//! chrome://tracing, ui.perfetto.dev and speedscope open.
//!
//! The same timeline as the Perfetto writer (see [`super::timeline`]): `M` metadata events
//! name each process and thread, every event becomes an instant (`ph:"i"`, thread scope) or
//! a slice begin/end (`B`/`E`) with its fields as `args`, and each counter sample a `C`
//! event of its process. Timestamps are microseconds with the nanoseconds kept as three
//! decimals, written as text so no precision is lost to a double.

use super::timeline::{Mark, Num, Scan, Step, Timeline};
use super::Events;
use std::io::{self, Write};
use ustrace_tracedat::{Event, Value};

/// A JSON string literal.
fn s(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

fn value(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Str(t) => s(t),
        Value::Bytes(b) => s(&super::hex(b)),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(u64::to_string).collect();
            format!("[{}]", items.join(","))
        }
    }
}

/// ns → µs with three decimals.
fn ts(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn args(ev: &Event) -> String {
    let mut out = format!("{{\"common_cpu\":{}", ev.cpu);
    for (name, v) in &ev.fields {
        out.push_str(&format!(",{}:{}", s(name), value(v)));
    }
    out.push('}');
    out
}

struct Writer<'o> {
    out: &'o mut dyn Write,
    first: bool,
}

impl Writer<'_> {
    fn object(&mut self, body: &str) -> io::Result<()> {
        let sep = if std::mem::take(&mut self.first) {
            ""
        } else {
            ",\n"
        };
        write!(self.out, "{sep}{{{body}}}")
    }

    fn event(&mut self, scan: &Scan, ev: &Event, step: &Step) -> io::Result<()> {
        let tgid = ev.tgid.unwrap_or(ev.pid);
        let head = format!("\"ts\":{},\"pid\":{},\"tid\":{}", ts(ev.ts), tgid, ev.pid);
        if let Some(count) = step.lost {
            // Global scope: a CPU's buffer lost them, not one thread.
            let count = if count > 0 {
                count.to_string()
            } else {
                "\"unknown\"".into()
            };
            self.object(&format!(
                "\"ph\":\"i\",\"s\":\"g\",\"name\":\"lost events\",\"ts\":{},\"pid\":{tgid},\
                 \"args\":{{\"cpu\":{},\"count\":{count}}}",
                ts(ev.ts),
                ev.cpu
            ))?;
        }
        match &step.mark {
            Mark::Instant => self.object(&format!(
                "\"ph\":\"i\",\"s\":\"t\",\"name\":{},\"cat\":{},{head},\"args\":{}",
                s(&ev.name),
                s(&ev.system),
                args(ev)
            ))?,
            Mark::Begin(name) => self.object(&format!(
                "\"ph\":\"B\",\"name\":{},\"cat\":{},{head},\"args\":{}",
                s(name),
                s(&ev.system),
                args(ev)
            ))?,
            Mark::End(names) => {
                for (i, name) in names.iter().enumerate() {
                    // The exit's fields go with the call it returned from, the last closed.
                    let args = if i + 1 == names.len() {
                        format!(",\"args\":{}", self::args(ev))
                    } else {
                        String::new()
                    };
                    self.object(&format!(
                        "\"ph\":\"E\",\"name\":{},\"cat\":{},{head}{args}",
                        s(name),
                        s(&ev.system)
                    ))?;
                }
            }
        }
        for (track, n) in &step.counters {
            let track = &scan.counter_tracks[*track];
            let spec = &scan.counters()[track.spec];
            let n = match n {
                Num::Int(i) => i.to_string(),
                Num::Float(f) => format!("{f:?}"),
            };
            self.object(&format!(
                "\"ph\":\"C\",\"name\":{},\"ts\":{},\"pid\":{},\"args\":{{{}:{n}}}",
                s(&spec.label()),
                ts(ev.ts),
                track.pid,
                s(&spec.field)
            ))?;
        }
        Ok(())
    }
}

/// Writes the Chrome JSON trace of `events`, which `scan` has read in a first pass.
pub fn write(out: &mut dyn Write, scan: &Scan, events: &dyn Events) -> io::Result<u64> {
    out.write_all(b"{\"traceEvents\":[\n")?;
    let mut w = Writer { out, first: true };
    for p in scan.processes.values() {
        w.object(&format!(
            "\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}",
            p.pid,
            p.pid,
            s(&p.name)
        ))?;
    }
    for t in scan.threads.values() {
        w.object(&format!(
            "\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}",
            t.tgid,
            t.tid,
            s(&t.comm)
        ))?;
    }
    let mut timeline = Timeline::new(scan);
    let mut n = 0u64;
    events.for_each(&mut |ev| {
        n += 1;
        let step = timeline.step(ev);
        w.event(scan, ev, &step)
    })?;
    w.out.write_all(b"\n],\"displayTimeUnit\":\"ns\"}\n")?;
    Ok(n)
}
