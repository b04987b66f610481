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
    /// The trace to read, as `ustrace record` or `trace-cmd record` wrote it.
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

/// `ustrace export`.
pub fn run(args: ExportArgs) -> Result<(), String> {
    let counters = args
        .counters
        .iter()
        .map(|c| CounterSpec::parse(c))
        .collect::<Result<Vec<_>, _>>()?;
    let reader = open(&args.file)?;
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
