//! `ustrace export`: a recorded trace.dat turned into what other viewers open — a Perfetto
//! trace (`--perfetto`), a Chrome JSON trace (`--chrome`), folded stacks (`--folded`).
//!
//! The trace.dat is read through `ustrace_tracedat::Reader`, which yields the events of all
//! CPUs merged by timestamp. Every export reads it twice: once for the [`timeline::Scan`]
//! (threads, processes, which probes pair into slices, which processes carry counters), once
//! to write. Each output goes to a temporary file beside it that is renamed over it only
//! when complete, so a trace that turns out corrupt half-way leaves no half-written file.

mod chrome;
pub(crate) mod folded;
mod perfetto;
mod protobuf;
pub(crate) mod timeline;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use timeline::{CounterSpec, Scan};
use ustrace_tracedat::Event;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("output").args(["perfetto", "chrome", "folded"]).required(true).multiple(true)))]
pub struct ExportArgs {
    /// The trace.dat to read (trace-cmd's file format, as `ustrace record` writes it).
    #[arg(value_name = "FILE", default_value = "trace.dat")]
    pub file: PathBuf,
    /// Write a Perfetto trace (protobuf TrackEvents) to OUT (`-` for standard output).
    #[arg(long, value_name = "OUT.pftrace")]
    pub perfetto: Option<PathBuf>,
    /// Write a Chrome JSON trace (`{"traceEvents":[...]}`) to OUT.
    #[arg(long, value_name = "OUT.json")]
    pub chrome: Option<PathBuf>,
    /// Write the folded stacks of the trace's stack events to OUT.
    #[arg(long, value_name = "OUT.folded")]
    pub folded: Option<PathBuf>,
    /// Also draw this numeric field as a counter track per process (repeatable).
    #[arg(long = "counter", value_name = "SYS:EVENT:FIELD")]
    pub counters: Vec<String>,
}

/// A trace's events in timestamp order, as many times as asked.
pub trait Events {
    /// Calls `f` on each event in order, stopping at the first error.
    fn for_each(&self, f: &mut dyn FnMut(&Event) -> io::Result<()>) -> io::Result<()>;
}

impl Events for Vec<Event> {
    fn for_each(&self, f: &mut dyn FnMut(&Event) -> io::Result<()>) -> io::Result<()> {
        self.iter().try_for_each(f)
    }
}

impl Events for ustrace_tracedat::Reader {
    fn for_each(&self, f: &mut dyn FnMut(&Event) -> io::Result<()>) -> io::Result<()> {
        for ev in self.events() {
            f(&ev?)?;
        }
        Ok(())
    }
}

/// Bytes as lowercase hex: how byte-array fields appear in both formats.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first pass over `events` for exports with these counters.
pub(crate) fn scan(events: &dyn Events, counters: Vec<CounterSpec>) -> io::Result<Scan> {
    let mut scan = Scan::new(counters);
    events.for_each(&mut |ev| {
        scan.add(ev);
        Ok(())
    })?;
    Ok(scan)
}

/// Writes `path` through `write`: to standard output for `-`, else into a temporary file
/// beside it, renamed over `path` once `write` has succeeded.
pub(crate) fn write_output<T>(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<T>,
) -> Result<T, String> {
    let ctx = |e: io::Error| format!("cannot write {}: {e}", path.display());
    if path == Path::new("-") {
        let stdout = io::stdout();
        let mut out = io::BufWriter::new(stdout.lock());
        let v = write(&mut out).map_err(ctx)?;
        out.flush().map_err(ctx)?;
        return Ok(v);
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let file = std::fs::File::create(&tmp)?;
        let mut out = io::BufWriter::new(file);
        let v = write(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(v)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(ctx)
}

/// Opens a trace.dat with an error that names it.
pub(crate) fn open(path: &Path) -> Result<ustrace_tracedat::Reader, String> {
    ustrace_tracedat::Reader::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Refuses a `--counter` the file's formats cannot satisfy, before anything is written: an
/// event it has no format for, a field the event does not have, a field that is no number.
fn check_counters(
    reader: &ustrace_tracedat::Reader,
    file: &Path,
    specs: &[CounterSpec],
) -> Result<(), String> {
    use ustrace_tracedat::FieldType;
    for spec in specs {
        let label = spec.label();
        let format = reader
            .formats()
            .find(|f| f.system == spec.system && f.name == spec.event)
            .ok_or_else(|| {
                format!(
                    "--counter {label}: {} has no `{}:{}` event",
                    file.display(),
                    spec.system,
                    spec.event
                )
            })?;
        let field = format
            .fields
            .iter()
            .find(|f| f.name == spec.field)
            .ok_or_else(|| {
                let names: Vec<&str> = format.fields.iter().map(|f| f.name.as_str()).collect();
                format!(
                    "--counter {label}: `{}:{}` has no field `{}` (its fields: {})",
                    spec.system,
                    spec.event,
                    spec.field,
                    names.join(", ")
                )
            })?;
        if !matches!(field.ty, FieldType::Int | FieldType::Pointer) {
            return Err(format!(
                "--counter {label}: the field is not a number ({})",
                field.c_type
            ));
        }
    }
    Ok(())
}

/// `ustrace export`.
pub fn run(args: ExportArgs) -> Result<(), String> {
    let counters = args
        .counters
        .iter()
        .map(|c| CounterSpec::parse(c))
        .collect::<Result<Vec<_>, _>>()?;
    let reader = open(&args.file)?;
    check_counters(&reader, &args.file, &counters)?;
    let read_err = |e: io::Error| format!("cannot read {}: {e}", args.file.display());
    if args.perfetto.is_some() || args.chrome.is_some() {
        let scan = scan(&reader, counters).map_err(read_err)?;
        for warning in scan.check()? {
            eprintln!("ustrace: {warning}");
        }
        if let Some(path) = &args.perfetto {
            let c = write_output(path, |out| perfetto::write(out, &scan, &reader))?;
            eprintln!(
                "{}: {} events, {} slices, {} counter samples on {} tracks",
                path.display(),
                c.events,
                c.slices,
                c.counters,
                c.tracks
            );
        }
        if let Some(path) = &args.chrome {
            let n = write_output(path, |out| chrome::write(out, &scan, &reader))?;
            eprintln!("{}: {n} events", path.display());
        }
    }
    if let Some(path) = &args.folded {
        let symbols = folded::symbols_of(&reader);
        let stacks = folded::fold(&reader, &symbols).map_err(read_err)?;
        if stacks.is_empty() {
            eprintln!(
                "ustrace: {} has no stack events (record with the stacktrace trigger, \
                 or the stacktrace or userstacktrace option)",
                args.file.display()
            );
        }
        write_output(path, |out| out.write_all(folded::text(&stacks).as_bytes()))?;
        eprintln!("{}: {} distinct stacks", path.display(), stacks.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::timeline::tests::{entry, ev, exit};
    use super::*;
    use ustrace_tracedat::Value;

    /// A small fixed trace: two threads of one process and one of another, nested probe
    /// pairs, an exit whose entry was lost, fields of every kind, a counter, a stack, and
    /// events lost before one.
    fn small() -> Vec<Event> {
        let mut main = ev(
            1_000,
            100,
            "kv",
            "get",
            vec![
                ("key", Value::Str("a\"b".into())),
                ("latency_ns", Value::UInt(1500)),
                ("delta", Value::Int(-3)),
                ("raw", Value::Bytes(vec![0xde, 0xad])),
                ("ids", Value::Array(vec![1, 2])),
            ],
        );
        main.comm = "server".into();
        let mut other = ev(
            2_500,
            200,
            "kv",
            "get",
            vec![
                ("key", Value::Str("z".into())),
                ("latency_ns", Value::UInt(7)),
            ],
        );
        other.tgid = Some(200);
        other.comm = "client".into();
        other.cpu = 1;
        // Its CPU's buffer lost four events just before it.
        other.missed_events = 4;
        let mut stack = ev(
            3_001,
            101,
            "ftrace",
            "kernel_stack",
            vec![
                ("size", Value::Int(2)),
                (
                    "caller",
                    Value::Array(vec![0x2010, 0x1010, 0, 0, 0, 0, 0, 0]),
                ),
            ],
        );
        stack.comm = "t101".into();
        vec![
            main,
            entry(1_200, 101, "handle__entry", 0x1000),
            entry(1_300, 101, "parse", 0x2000),
            exit(1_450, 101, "parse_ret", 0x2000),
            other,
            // An exit of a call entered before the trace began.
            exit(2_600, 101, "parse_ret", 0x2000),
            entry(2_700, 101, "parse", 0x2000),
            // parse's exit is lost: handle's closes both.
            exit(3_000, 101, "handle__exit", 0x1000),
            stack,
        ]
    }

    fn scan_small(events: &Vec<Event>) -> Scan {
        let s = scan(
            events,
            vec![CounterSpec::parse("kv:get:latency_ns").unwrap()],
        )
        .unwrap();
        assert!(s.check().unwrap().is_empty());
        s
    }

    /// Compares `got` with tests/golden/export/NAME, or writes it under `USTRACE_BLESS=1`.
    fn golden(name: &str, got: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/export")
            .join(name);
        if std::env::var_os("USTRACE_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, got).unwrap();
            return;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (USTRACE_BLESS=1 writes it)", path.display()));
        assert!(
            want == got,
            "{name} differs from its golden file (USTRACE_BLESS=1 rewrites it):\n{got}"
        );
    }

    #[test]
    fn chrome_json_of_a_small_trace_matches_its_golden_file() {
        let events = small();
        let mut out = Vec::new();
        let n = chrome::write(&mut out, &scan_small(&events), &events).unwrap();
        assert_eq!(n, 9);
        let text = String::from_utf8(out).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(json["traceEvents"][5]["args"]["key"], "a\"b");
        golden("small.json", &text);
    }

    #[test]
    fn perfetto_trace_of_a_small_trace_matches_its_golden_file() {
        use ::protobuf::Message;
        let events = small();
        let mut out = Vec::new();
        let counts = perfetto::write(&mut out, &scan_small(&events), &events).unwrap();
        assert_eq!(
            (counts.events, counts.slices, counts.counters, counts.tracks),
            (9, 3, 2, 8)
        );
        // The golden is the text form Perfetto's own types print: reviewable by eye, and
        // any byte we encode wrongly shows up as an unknown field or a parse error.
        let trace = perfetto_protos::trace::Trace::parse_from_bytes(&out).unwrap();
        golden(
            "small.pftrace.txt",
            &::protobuf::text_format::print_to_string_pretty(&trace),
        );
    }

    #[test]
    fn folded_stacks_of_a_small_trace_match_their_golden_file() {
        let events = small();
        let symbols = folded::Symbols::from_kallsyms("1000 T handle\n2000 T parse\n");
        let stacks = folded::fold(&events, &symbols).unwrap();
        golden("small.folded", &folded::text(&stacks));
    }
}
