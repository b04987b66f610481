//! Where the drained pages go: a trace.dat written by `ustrace_tracedat::Writer`, with
//! the formats, cmdlines and clock read from the target's tracefs over its control socket.

use std::io;
use std::path::Path;

use ustrace_ctl::client::Client;
use ustrace_tracedat::{TraceMeta, Writer};

/// The output file being written.
pub struct Sink {
    writer: Writer,
    /// The events whose formats the file carries.
    events: Vec<(String, String)>,
    /// The target's pid and name, known from /proc at the start: a target that dies
    /// before its tracer saved its name still gets it in the report.
    target: Option<(u32, String)>,
}

/// A tracefs file of the target, as the metadata reader wants it.
fn read_remote(client: &mut Client, path: &str) -> io::Result<Vec<u8>> {
    client
        .read_file(path)
        .map_err(|e| io::Error::from_raw_os_error(e.errno().0))
}

/// The enabled events (`set_event`), as `(system, event)`.
fn enabled_events(client: &mut Client) -> Result<Vec<(String, String)>, String> {
    let text = read_remote(client, "set_event").map_err(|e| format!("set_event: {e}"))?;
    Ok(String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| {
            let (s, e) = l.trim().split_once(':')?;
            Some((s.to_string(), e.to_string()))
        })
        .collect())
}

fn meta(
    client: &mut Client,
    events: &[(String, String)],
    target: Option<&(u32, String)>,
) -> io::Result<TraceMeta> {
    let mut meta = TraceMeta::from_tracefs(&mut |p| read_remote(client, p), Some(events))?;
    if let Some((pid, comm)) = target {
        let known = String::from_utf8_lossy(&meta.saved_cmdlines)
            .lines()
            .any(|l| l.split_whitespace().next() == Some(&pid.to_string()));
        if !known {
            meta.saved_cmdlines
                .extend_from_slice(format!("{pid} {comm}\n").as_bytes());
        }
    }
    Ok(meta)
}

impl Sink {
    /// Creates the output; `client` reaches the target's tracefs for the formats.
    pub fn create(path: &Path, client: &mut Client, pid: u32) -> Result<Sink, String> {
        let events = enabled_events(client)?;
        let target = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|c| (pid, c.trim_end().to_string()));
        let meta = meta(client, &events, target.as_ref())
            .map_err(|e| format!("reading the formats: {e}"))?;
        let writer = Writer::create(path, &meta).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Sink {
            writer,
            events,
            target,
        })
    }

    /// One page as `trace_pipe_raw` gives it.
    pub fn push_page(&mut self, cpu: usize, page: &[u8]) -> io::Result<()> {
        self.writer.push_page(cpu, page)
    }

    /// Re-reads what grows while the target runs (saved_cmdlines, saved_tgids).
    pub fn refresh_meta(&mut self, client: &mut Client) {
        if let Ok(meta) = meta(client, &self.events, self.target.as_ref()) {
            self.writer.update_meta(&meta);
        }
    }

    /// The text of `per_cpu/cpuN/stats` at the end.
    pub fn set_cpu_stats(&mut self, cpu: usize, stats: String) {
        self.writer.set_cpu_stats(cpu, stats);
    }

    /// Completes the file; the number of events in it.
    pub fn finish(self) -> io::Result<Option<u64>> {
        let summary = self.writer.finish()?;
        Ok(Some(summary.events.iter().sum()))
    }
}
