//! `ustrace stream -p PID` (or `--tracefs DIR`): events printed live, as `trace-cmd
//! stream` prints them.
//!
//! It reads whole ring-buffer pages from every CPU's `per_cpu/cpuN/trace_pipe_raw` (over
//! the process's control socket, or from a mounted tracefs such as the kernel's) and decodes
//! them with `ustrace-tracedat`'s decoder and printer — the same code `ustrace report` uses
//! on a file, so a streamed line reads exactly like the reported one. Reading consumes:
//! what `stream` prints is gone from the buffer, as with trace-cmd.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ustrace_ctl::client::{Client, CtlError};
use ustrace_ctl::vfs::OpenFlags;
use ustrace_tracedat::{decode_page, Decoder, Printer, TraceMeta};

#[derive(clap::Args)]
pub struct StreamArgs {
    /// The process whose tracefs to stream (see `ustrace ps`).
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        conflicts_with = "tracefs"
    )]
    pub pid: Option<u32>,
    /// A mounted tracefs to stream instead (`/sys/kernel/tracing`, a `ustrace mount`).
    #[arg(long, value_name = "DIR")]
    pub tracefs: Option<PathBuf>,
    /// Stream this instance's buffers (`instances/NAME/per_cpu/...`).
    #[arg(short = 'B', long = "instance", value_name = "NAME")]
    pub instance: Option<String>,
    /// Print each event's fields as `name=value` instead of its print format (as
    /// `trace-cmd report -R`).
    #[arg(short = 'R', long)]
    pub raw: bool,
    /// Stop after this many seconds (default: until interrupted).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
}

/// Where files and pages come from.
enum Source {
    Remote(Client, Vec<u64>),
    Dir(PathBuf, Vec<File>),
}

fn ctl(path: &str, e: CtlError) -> io::Error {
    io::Error::new(io::Error::from(e.errno()).kind(), format!("{path}: {e}"))
}

impl Source {
    fn read_file(&mut self, path: &str) -> io::Result<Vec<u8>> {
        match self {
            Source::Remote(client, _) => client.read_file(path).map_err(|e| {
                let errno = e.errno();
                let err = io::Error::from(errno);
                io::Error::new(err.kind(), format!("{path}: {e}"))
            }),
            Source::Dir(dir, _) => read_whole(&dir.join(path)),
        }
    }

    fn open_pages(&mut self, prefix: &str, cpus: usize) -> io::Result<()> {
        for cpu in 0..cpus {
            let path = format!("{prefix}per_cpu/cpu{cpu}/trace_pipe_raw");
            match self {
                Source::Remote(client, handles) => {
                    let flags = OpenFlags {
                        nonblock: true,
                        ..OpenFlags::READ
                    };
                    handles.push(client.open(&path, flags).map_err(|e| ctl(&path, e))?.handle);
                }
                Source::Dir(dir, files) => files.push(
                    File::options()
                        .read(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(dir.join(&path))
                        .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?,
                ),
            }
        }
        Ok(())
    }

    /// One page of `cpu`, or `None` when it has nothing now.
    fn read_page(&mut self, cpu: usize, page_size: usize) -> io::Result<Option<Vec<u8>>> {
        match self {
            Source::Remote(client, handles) => {
                match client.read(handles[cpu], page_size as u32, Some(Duration::ZERO)) {
                    Ok(d) if d.is_empty() => Ok(None),
                    Ok(d) => Ok(Some(d)),
                    Err(e) if e.errno().0 == libc::EAGAIN => Ok(None),
                    Err(e) => Err(ctl("trace_pipe_raw", e)),
                }
            }
            Source::Dir(_, files) => {
                let mut page = vec![0u8; page_size];
                match files[cpu].read(&mut page) {
                    Ok(0) => Ok(None),
                    Ok(n) => {
                        page.truncate(n);
                        Ok(Some(page))
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
                    Err(e) => Err(e),
                }
            }
        }
    }
}

/// Reads a file with large reads: the kernel's `events/header_page` answers a small first
/// read (std's 32-byte probe) with a partial text and then end of file.
fn read_whole(path: &std::path::Path) -> io::Result<Vec<u8>> {
    let mut file = File::open(path)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut buf)? {
            0 => return Ok(out),
            n => out.extend_from_slice(&buf[..n]),
        }
    }
}

pub fn run(args: StreamArgs) -> Result<(), String> {
    let mut source = match (&args.pid, &args.tracefs) {
        (Some(pid), _) => Source::Remote(
            Client::connect(*pid).map_err(|e| e.to_string())?,
            Vec::new(),
        ),
        (None, Some(dir)) => Source::Dir(dir.clone(), Vec::new()),
        (None, None) => return Err("stream: give -p PID or --tracefs DIR".into()),
    };
    let prefix = args
        .instance
        .as_ref()
        .map_or_else(String::new, |n| format!("instances/{n}/"));
    let meta =
        TraceMeta::from_tracefs(&mut |p| source.read_file(p), None).map_err(|e| e.to_string())?;
    let layout = meta.page_layout().map_err(|e| e.to_string())?;
    let mut decoder = Decoder::new(&meta).map_err(|e| e.to_string())?;
    let clock = source
        .read_file(&format!("{prefix}trace_clock"))
        .ok()
        .and_then(|t| ustrace_tracedat::meta::selected_clock(&String::from_utf8_lossy(&t)))
        .unwrap_or_else(|| meta.trace_clock.clone());
    let printer = Printer::new(decoder.formats().map(|f| &**f), &clock, &meta.kallsyms);
    source
        .open_pages(&prefix, meta.cpus)
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut threads_read = Instant::now();
    let mut page = vec![0u8; layout.page_size];
    loop {
        let over = args
            .duration
            .is_some_and(|d| start.elapsed().as_secs_f64() >= d);
        let mut batch = Vec::new();
        for cpu in 0..meta.cpus {
            while let Some(data) = source
                .read_page(cpu, layout.page_size)
                .map_err(|e| e.to_string())?
            {
                page.fill(0);
                let n = data.len().min(page.len());
                page[..n].copy_from_slice(&data[..n]);
                let decoded = match decode_page(&page, &layout) {
                    Ok(d) => d,
                    Err(e) => {
                        eprintln!("ustrace stream: cpu {cpu}: {e}");
                        continue;
                    }
                };
                for (i, rec) in decoded.records.iter().enumerate() {
                    let missed = match (i, decoded.missed, decoded.missed_unknown) {
                        (0, Some(m), _) => i64::try_from(m).unwrap_or(i64::MAX),
                        (0, None, true) => -1,
                        _ => 0,
                    };
                    let data = &page[rec.start..rec.start + rec.len];
                    batch.push(decoder.decode(cpu as u32, rec.ts, data, missed));
                }
            }
        }
        if batch.is_empty() {
            if over {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
            // New threads get names while streaming.
            if threads_read.elapsed() > Duration::from_secs(1) {
                if let Ok(text) = source.read_file("saved_cmdlines") {
                    let mut fresh = meta.clone();
                    fresh.saved_cmdlines = text;
                    decoder.update_threads(&fresh);
                }
                threads_read = Instant::now();
            }
            continue;
        }
        batch.sort_by_key(|e| (e.ts, e.cpu));
        for ev in &batch {
            outln!("{}", printer.line(ev, args.raw));
        }
        // A busy buffer never runs dry: the deadline still ends the stream (after printing
        // what was read, so nothing taken from the buffer is lost).
        if over {
            return Ok(());
        }
    }
}
