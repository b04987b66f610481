//! [`Writer`]: streams pages to a trace.dat (trace-cmd's file version 6, uncompressed).
//!
//! Version 6 keeps each CPU's pages contiguous after the headers, and the headers hold
//! what is only known at the end (saved_cmdlines, per-CPU stats). So the first CPU to
//! send a page writes straight into the file, after room left for the headers (the
//! headers as they would be now plus 256 KiB for what grows); every other CPU's pages go to
//! an unlinked scratch file, and `finish` writes the headers, the options (per-CPU stats,
//! the clock), the CPU table, and copies the scratch files in at page-aligned offsets (the
//! table says where each CPU is, in any order). A single-CPU recording is written once;
//! headers that outgrew their room move the direct CPU's pages past the others.
//! Version 6 is what every trace-cmd (2.x and 3.x) and KernelShark read.
//!
//! ```text
//!  magic "\x17\x08Dtracing" "6\0" endian long_size page_size
//!  header_page, header_event, ftrace formats, event formats, kallsyms, printk, cmdlines
//!  cpus "options  \0" {CPUSTAT "CPU: N\n"+stats}* TRACECLOCK 0
//!  "flyrecord\0" {offset size}*cpus  [clock]  pad  cpu0 pages  pad  cpu1 pages ...
//! ```

use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::meta::TraceMeta;
use crate::page::{count_records, PageLayout};

/// trace.dat's magic bytes and the word that follows.
pub(crate) const MAGIC: &[u8] = b"\x17\x08\x44tracing";

/// trace-cmd's option ids (`TRACECMD_OPTION_*`).
pub(crate) mod option {
    pub const DONE: u16 = 0;
    pub const CPUSTAT: u16 = 2;
    pub const BUFFER: u16 = 3;
    pub const TRACECLOCK: u16 = 4;
    pub const CPUCOUNT: u16 = 8;
    pub const VERSION: u16 = 9;
    pub const HEADER_INFO: u16 = 16;
    pub const FTRACE_EVENTS: u16 = 17;
    pub const EVENT_FORMATS: u16 = 18;
    pub const KALLSYMS: u16 = 19;
    pub const PRINTK: u16 = 20;
    pub const CMDLINES: u16 = 21;
}

/// What [`Writer::finish`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteSummary {
    /// Bytes of the whole file.
    pub bytes: u64,
    /// Pages written, per CPU.
    pub pages: Vec<u64>,
    /// Data events in those pages, per CPU.
    pub events: Vec<u64>,
}

struct CpuData {
    /// Where its pages go: the file itself (the direct CPU) or its scratch file.
    file: Option<BufWriter<File>>,
    bytes: u64,
    pages: u64,
    events: u64,
}

/// Room for the headers written at the end beyond what they take at the start.
const HEAD_SLACK: u64 = 256 << 10;

/// Streams a trace.dat to disk: pages arrive per CPU in any interleaving.
pub struct Writer {
    path: PathBuf,
    out: File,
    meta: TraceMeta,
    layout: PageLayout,
    cpus: Vec<CpuData>,
    stats: Vec<(usize, String)>,
    /// The CPU whose pages go straight into the file, at `reserve`.
    direct: Option<usize>,
    /// Where the direct CPU's pages start: after room for the headers.
    reserve: u64,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("path", &self.path).finish()
    }
}

fn scratch(path: &Path, cpu: usize) -> io::Result<File> {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".cpu{cpu}.tmp"));
    let tmp = PathBuf::from(name);
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    // Unlinked at once: nothing is left behind if the recorder dies.
    std::fs::remove_file(&tmp)?;
    Ok(file)
}

impl Writer {
    /// Creates (truncates) `path`; the headers are written by [`Writer::finish`].
    pub fn create(path: &Path, meta: &TraceMeta) -> io::Result<Writer> {
        let layout = meta.page_layout()?;
        // Check the formats now rather than write a file no reader can use.
        meta.formats()?;
        // Read too: headers that outgrow their room move pages within the file.
        let out = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        let cpus = meta.cpus.max(1);
        let placeholder: Vec<(usize, String)> = (0..cpus).map(|c| (c, " ".repeat(300))).collect();
        let (head, _) = build_head(meta, cpus, &placeholder);
        let page = layout.page_size as u64;
        let reserve = (head.len() as u64 + HEAD_SLACK).div_ceil(page) * page;
        Ok(Writer {
            path: path.to_path_buf(),
            out,
            meta: meta.clone(),
            layout,
            cpus: Vec::new(),
            stats: Vec::new(),
            direct: None,
            reserve,
        })
    }

    /// Appends one ring-buffer page of `cpu` exactly as `per_cpu/cpuN/trace_pipe_raw`
    /// gives it (a partial read of the last page is padded to a whole page by the caller
    /// or here). A page that does not decode is refused: it would make the file unreadable.
    pub fn push_page(&mut self, cpu: usize, page: &[u8]) -> io::Result<()> {
        let size = self.layout.page_size;
        if page.is_empty() || page.len() > size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("page of {} bytes, the page size is {size}", page.len()),
            ));
        }
        let mut whole;
        let page = if page.len() < size {
            whole = page.to_vec();
            whole.resize(size, 0);
            &whole[..]
        } else {
            page
        };
        let events = count_records(page, &self.layout)?;
        if cpu >= 4096 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cpu {cpu} out of range"),
            ));
        }
        while self.cpus.len() <= cpu {
            self.cpus.push(CpuData {
                file: None,
                bytes: 0,
                pages: 0,
                events: 0,
            });
        }
        let data = &mut self.cpus[cpu];
        if data.file.is_none() {
            let file = if self.direct.is_none() {
                let mut file = self.out.try_clone()?;
                file.seek(SeekFrom::Start(self.reserve))?;
                self.direct = Some(cpu);
                file
            } else {
                scratch(&self.path, cpu)?
            };
            data.file = Some(BufWriter::with_capacity(1 << 16, file));
        }
        if let Some(file) = data.file.as_mut() {
            file.write_all(page)?;
        }
        data.bytes += size as u64;
        data.pages += 1;
        data.events += events as u64;
        Ok(())
    }

    /// The text of `per_cpu/cpuN/stats` at the end (lost/overrun counts go in the file,
    /// where `trace-cmd report --stat` shows them).
    pub fn set_cpu_stats(&mut self, cpu: usize, stats: String) {
        match self.stats.iter_mut().find(|(c, _)| *c == cpu) {
            Some(slot) => slot.1 = stats,
            None => self.stats.push((cpu, stats)),
        }
    }

    /// Replaces the metadata read at the start (saved_cmdlines and saved_tgids grow while
    /// tracing). The page layout must stay the same.
    pub fn update_meta(&mut self, meta: &TraceMeta) {
        if meta.page_layout().ok() == Some(self.layout) {
            self.meta = meta.clone();
        }
    }

    /// Writes the headers and every CPU's pages; the file is complete when this returns.
    pub fn finish(mut self) -> io::Result<WriteSummary> {
        let cpus = self.meta.cpus.max(self.cpus.len()).max(1);
        self.stats.sort_by_key(|(c, _)| *c);
        let (mut head, table_at) = build_head(&self.meta, cpus, &self.stats);
        let page = self.layout.page_size as u64;
        let round = |n: u64| n.div_ceil(page) * page;
        // The direct CPU's pages are in the file already; flush what is buffered.
        let direct = self.direct;
        let direct_size = direct.map_or(0, |c| self.cpus[c].bytes);
        if let Some(c) = direct {
            if let Some(buf) = self.cpus[c].file.take() {
                buf.into_inner().map_err(|e| e.into_error())?;
            }
        }
        let fits = head.len() as u64 <= self.reserve;
        let mut offset = if direct.is_none() {
            round(head.len() as u64)
        } else if fits {
            round(self.reserve + direct_size)
        } else {
            round((head.len() as u64).max(self.reserve + direct_size))
        };
        let mut placed = Vec::with_capacity(cpus);
        for cpu in 0..cpus {
            let size = self.cpus.get(cpu).map_or(0, |d| d.bytes);
            let at = if fits && direct == Some(cpu) {
                self.reserve
            } else {
                let at = offset;
                offset = round(offset + size);
                at
            };
            placed.push((at, size));
            let t = table_at + cpu * 16;
            head[t..t + 8].copy_from_slice(&at.to_le_bytes());
            head[t + 8..t + 16].copy_from_slice(&size.to_le_bytes());
        }
        if let (Some(c), false) = (direct, fits) {
            // The headers outgrew their room: move the direct pages to their new place
            // (after the old one, so the ranges do not overlap) before the headers
            // overwrite their start.
            move_within(&self.out, self.reserve, placed[c].0, direct_size)?;
        }
        for (cpu, &(at, size)) in placed.iter().enumerate() {
            let Some(data) = self.cpus.get_mut(cpu) else {
                continue;
            };
            let Some(buf) = data.file.take() else {
                continue;
            };
            let mut file = buf.into_inner().map_err(|e| e.into_error())?;
            file.seek(SeekFrom::Start(0))?;
            self.out.seek(SeekFrom::Start(at))?;
            let copied = io::copy(&mut (&mut file).take(size), &mut self.out)?;
            if copied != size {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("cpu {cpu}: copied {copied} of {size} bytes"),
                ));
            }
        }
        self.out.write_all_at(&head, 0)?;
        let end = placed
            .iter()
            .map(|(a, s)| a + s)
            .max()
            .unwrap_or(0)
            .max(head.len() as u64);
        self.out.set_len(end)?;
        Ok(WriteSummary {
            bytes: end,
            pages: (0..cpus)
                .map(|c| self.cpus.get(c).map_or(0, |d| d.pages))
                .collect(),
            events: (0..cpus)
                .map(|c| self.cpus.get(c).map_or(0, |d| d.events))
                .collect(),
        })
    }
}

/// Copies `len` bytes of `file` from `from` to `to` (`to >= from + len`).
fn move_within(file: &File, from: u64, to: u64, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], from + done)?;
        file.write_all_at(&buf[..n], to + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Everything before the CPU data, with the CPU table zeroed; where the table starts.
fn build_head(meta: &TraceMeta, cpus: usize, stats: &[(usize, String)]) -> (Vec<u8>, usize) {
    let mut head = Vec::new();
    write_headers(&mut head, meta, cpus, stats);
    head.extend_from_slice(b"flyrecord\0");
    let table_at = head.len();
    head.resize(head.len() + 16 * cpus, 0);
    let clock = format!("[{}]", meta.trace_clock);
    head.extend_from_slice(&(clock.len() as u64).to_le_bytes());
    head.extend_from_slice(clock.as_bytes());
    (head, table_at)
}

fn put_block8(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(data);
}

fn put_block4(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
}

fn put_option(out: &mut Vec<u8>, id: u16, data: &[u8]) {
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
}

/// Everything before `flyrecord`.
fn write_headers(out: &mut Vec<u8>, meta: &TraceMeta, cpus: usize, stats: &[(usize, String)]) {
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(b"6\0");
    out.push(0); // little endian
    out.push(std::mem::size_of::<usize>() as u8);
    out.extend_from_slice(&meta.page_size.to_le_bytes());
    out.extend_from_slice(b"header_page\0");
    put_block8(out, &meta.header_page);
    out.extend_from_slice(b"header_event\0");
    put_block8(out, &meta.header_event);
    out.extend_from_slice(&(meta.ftrace_formats.len() as u32).to_le_bytes());
    for f in &meta.ftrace_formats {
        put_block8(out, f);
    }
    out.extend_from_slice(&(meta.event_formats.len() as u32).to_le_bytes());
    for (system, formats) in &meta.event_formats {
        out.extend_from_slice(system.as_bytes());
        out.push(0);
        out.extend_from_slice(&(formats.len() as u32).to_le_bytes());
        for f in formats {
            put_block8(out, f);
        }
    }
    put_block4(out, &meta.kallsyms);
    put_block4(out, &meta.printk_formats);
    put_block8(out, &meta.saved_cmdlines);
    out.extend_from_slice(&(cpus as u32).to_le_bytes());
    out.extend_from_slice(b"options  \0");
    for (cpu, text) in stats {
        let mut data = format!("CPU: {cpu}\n{text}").into_bytes();
        data.push(0);
        put_option(out, option::CPUSTAT, &data);
    }
    // Bracketed as in the `trace_clock` file: that is how trace-cmd finds the name.
    let mut clock = format!("[{}]", meta.trace_clock).into_bytes();
    clock.push(0);
    put_option(out, option::TRACECLOCK, &clock);
    let mut version = format!("ustrace {}", env!("CARGO_PKG_VERSION")).into_bytes();
    version.push(0);
    put_option(out, option::VERSION, &version);
    out.extend_from_slice(&option::DONE.to_le_bytes());
}
