//! [`Reader`]: opens a trace.dat (version 6, or 7 without compression) and yields its
//! events merged by time, decoded with the event formats the file carries.
//!
//! The file is untrusted: every size read from it is checked against what is left of the
//! file before anything is allocated, a malformed page is reported as an error naming the
//! CPU and file offset and reading goes on with the next page, and nothing panics on any
//! input (the `tracedat_read` fuzz target holds it to that).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use crate::format::{EventFormat, Field, FieldType};
use crate::meta::{selected_clock, TraceMeta};
use crate::page::{decode_page, DecodedPage, PageLayout};
use crate::write::{option, MAGIC};

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// A field's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A signed integer field.
    Int(i64),
    /// An unsigned integer field (and pointers).
    UInt(u64),
    /// A string: `char[N]`, `__data_loc char[]` or a `char buf[]` tail, up to its NUL.
    Str(String),
    /// Any other dynamic array, as bytes.
    Bytes(Vec<u8>),
    /// A fixed integer array, each element zero-extended.
    Array(Vec<u64>),
}

/// One event of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// CPU whose buffer held it.
    pub cpu: u32,
    /// Timestamp in trace-clock units as recorded (ns for the ns clocks).
    pub ts: u64,
    /// `common_pid` (a thread id).
    pub pid: i32,
    /// Thread-group id from saved_tgids, when known.
    pub tgid: Option<i32>,
    /// Thread name from saved_cmdlines, `<...>` when unknown (`<idle>` for pid 0).
    pub comm: String,
    /// `common_type`.
    pub id: u16,
    /// Subsystem (empty when the id has no format in the file).
    pub system: String,
    /// Event name (empty when the id has no format in the file).
    pub name: String,
    /// `common_flags` (irqs-off, need-resched, hardirq, softirq bits).
    pub flags: u8,
    /// `common_preempt_count`.
    pub preempt: u8,
    /// The non-common fields, in format order.
    pub fields: Vec<(String, Value)>,
    /// Events lost just before this one, as the page header says (on the first event
    /// after a loss): 0 none, N > 0 that many, -1 some but the count was not stored.
    pub missed_events: i64,
    /// The record's bytes (common header first), for printing with its format.
    pub data: Vec<u8>,
}

/// Where the file's bytes are.
enum Backing {
    File(File),
    Memory(Vec<u8>),
}

impl Backing {
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        match self {
            Backing::File(f) => f.read_exact_at(buf, at),
            Backing::Memory(m) => {
                let start = usize::try_from(at).unwrap_or(usize::MAX);
                let src = start
                    .checked_add(buf.len())
                    .and_then(|end| m.get(start..end))
                    .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
                buf.copy_from_slice(src);
                Ok(())
            }
        }
    }
}

/// Reads a trace.dat file.
pub struct Reader {
    file: Backing,
    meta: TraceMeta,
    layout: PageLayout,
    decoder: Decoder,
    cpu_data: Vec<(u64, u64)>,
    cpu_stats: Vec<(usize, String)>,
    version: u32,
    options: Vec<(u16, Vec<u8>)>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("version", &self.version)
            .field("cpus", &self.cpu_data.len())
            .finish()
    }
}

/// A cursor over the file's header bytes with checked reads.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> io::Result<&'a [u8]> {
        if self.buf.len() - self.pos < n {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "trace.dat truncated in {what} (need {n} bytes at offset {})",
                    self.pos
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u16(&mut self, what: &str) -> io::Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> io::Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> io::Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn cstr(&mut self, what: &str) -> io::Result<String> {
        let rest = &self.buf[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| bad(format!("trace.dat: unterminated string in {what}")))?;
        let s = String::from_utf8_lossy(&rest[..n]).into_owned();
        self.pos += n + 1;
        Ok(s)
    }
    fn block8(&mut self, what: &str) -> io::Result<&'a [u8]> {
        let n = self.u64(what)?;
        self.take(usize::try_from(n).unwrap_or(usize::MAX), what)
    }
    fn block4(&mut self, what: &str) -> io::Result<&'a [u8]> {
        let n = self.u32(what)?;
        self.take(n as usize, what)
    }
    fn count(&mut self, what: &str, min_each: usize) -> io::Result<usize> {
        let n = self.u32(what)? as usize;
        // Each item takes at least `min_each` bytes: a count the file cannot hold is bad.
        if n.saturating_mul(min_each) > self.buf.len() - self.pos {
            // Like a short read: the caller may retry with more of the file.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("trace.dat: {what} count {n} exceeds the file"),
            ));
        }
        Ok(n)
    }
}

impl Reader {
    /// Opens and parses the headers of `path`.
    pub fn open(path: &Path) -> io::Result<Reader> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        // The headers are parsed from a prefix of the file that grows until they fit
        // (they end before the first page; pages are read one at a time later).
        let backing = Backing::File(file);
        let mut head_len = len.min(1 << 20);
        loop {
            let mut head = vec![0u8; head_len as usize];
            backing.read_exact_at(&mut head, 0)?;
            match Self::parse(&head, len, &backing) {
                Err(e)
                    if e.kind() == io::ErrorKind::UnexpectedEof && head_len < len.min(MAX_HEAD) =>
                {
                    head_len = (head_len * 4).min(len).min(MAX_HEAD);
                }
                Err(e) => return Err(e),
                Ok(parts) => return Ok(Self::build(parts, backing)),
            }
        }
    }

    /// Parses a whole file held in memory (what the fuzz target feeds).
    pub fn from_bytes(bytes: Vec<u8>) -> io::Result<Reader> {
        let backing = Backing::Memory(bytes);
        let parsed = match &backing {
            Backing::Memory(m) => Self::parse(m, m.len() as u64, &backing)?,
            Backing::File(_) => return Err(bad("not a file in memory")),
        };
        Ok(Self::build(parsed, backing))
    }

    fn build(p: Parsed, file: Backing) -> Reader {
        Reader {
            file,
            meta: p.meta,
            layout: p.layout,
            decoder: p.decoder,
            cpu_data: p.cpu_data,
            cpu_stats: p.cpu_stats,
            version: p.version,
            options: p.options,
        }
    }

    fn parse(head: &[u8], file_len: u64, file: &Backing) -> io::Result<Parsed> {
        let mut c = Cursor { buf: head, pos: 0 };
        if c.take(MAGIC.len(), "magic")? != MAGIC {
            return Err(bad("not a trace.dat file (bad magic)"));
        }
        let version: u32 = c
            .cstr("version")?
            .parse()
            .map_err(|_| bad("trace.dat: bad version string"))?;
        if version != 6 && version != 7 {
            return Err(bad(format!(
                "trace.dat version {version} is not supported (6 and 7 are)"
            )));
        }
        let endian = c.take(1, "endian")?[0];
        if endian != 0 {
            return Err(bad("big-endian trace.dat files are not supported"));
        }
        let _long_size = c.take(1, "long size")?[0];
        let page_size = c.u32("page size")?;
        let parts = if version == 6 {
            parse_v6(&mut c, file_len)?
        } else {
            parse_v7(&mut c, file_len, file)?
        };
        let layout = PageLayout::parse(&String::from_utf8_lossy(&parts.header_page))?;
        if layout.page_size != page_size as usize {
            return Err(bad(format!(
                "trace.dat: page size {page_size} but header_page describes {}",
                layout.page_size
            )));
        }
        let mut trace_clock = parts.clock.unwrap_or_else(|| "local".to_string());
        let mut cpu_stats = Vec::new();
        let mut cpu_count = None;
        for (id, data) in &parts.options {
            let text = String::from_utf8_lossy(data.split(|&b| b == 0).next().unwrap_or(&[]));
            match *id {
                option::TRACECLOCK => {
                    if let Some(clock) = selected_clock(&text) {
                        trace_clock = clock;
                    }
                }
                option::CPUSTAT => {
                    if let Some(rest) = text.strip_prefix("CPU: ") {
                        let (n, stats) = rest.split_once('\n').unwrap_or((rest, ""));
                        if let Ok(n) = n.trim().parse() {
                            cpu_stats.push((n, stats.to_string()));
                        }
                    }
                }
                option::CPUCOUNT if data.len() >= 4 => {
                    cpu_count = Some(u32::from_le_bytes([data[0], data[1], data[2], data[3]]));
                }
                _ => {}
            }
        }
        let cpus = parts
            .cpus
            .max(cpu_count.map_or(0, |n| n as usize).min(4096))
            .max(parts.cpu_data.len());
        let meta = TraceMeta {
            header_page: parts.header_page,
            header_event: parts.header_event,
            ftrace_formats: parts.ftrace_formats,
            event_formats: parts.event_formats,
            kallsyms: parts.kallsyms,
            printk_formats: parts.printk_formats,
            saved_cmdlines: parts.saved_cmdlines,
            saved_tgids: Vec::new(),
            trace_clock,
            cpus,
            page_size,
        };
        let decoder = Decoder::new(&meta)?;
        Ok(Parsed {
            meta,
            layout,
            decoder,
            cpu_data: parts.cpu_data,
            cpu_stats,
            version,
            options: parts.options,
        })
    }

    /// Everything the file holds besides the pages.
    pub fn meta(&self) -> &TraceMeta {
        &self.meta
    }

    /// The file's version (6).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The per-CPU stats stored at the end of the recording: `(cpu, stats text)`.
    pub fn cpu_stats(&self) -> &[(usize, String)] {
        &self.cpu_stats
    }

    /// The raw options (id, data) of the options section.
    pub fn options(&self) -> &[(u16, Vec<u8>)] {
        &self.options
    }

    /// The format of event `id`.
    pub fn format(&self, id: u16) -> Option<&Arc<EventFormat>> {
        self.decoder.formats.get(&id)
    }

    /// Every event format in the file.
    pub fn formats(&self) -> impl Iterator<Item = &Arc<EventFormat>> {
        self.decoder.formats.values()
    }

    /// The record decoder of this file's formats and thread names.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// Offset and size of each CPU's pages in the file.
    pub fn cpu_data(&self) -> &[(u64, u64)] {
        &self.cpu_data
    }

    /// The page layout of the file.
    pub fn page_layout(&self) -> PageLayout {
        self.layout
    }

    /// Every event of every CPU, merged by timestamp (the order `trace-cmd report`
    /// prints: the earliest first, the lower CPU first on a tie).
    pub fn events(&self) -> impl Iterator<Item = io::Result<Event>> + '_ {
        Events {
            reader: self,
            cpus: self
                .cpu_data
                .iter()
                .map(|&(offset, size)| CpuCursor {
                    next: offset,
                    end: offset + size,
                    page: Vec::new(),
                    decoded: DecodedPage::default(),
                    idx: 0,
                })
                .collect(),
        }
    }

    /// Decodes one record (`data`: common header first) of `cpu` at `ts`.
    pub fn decode(&self, cpu: u32, ts: u64, data: &[u8], missed_events: i64) -> Event {
        self.decoder.decode(cpu, ts, data, missed_events)
    }
}

/// Turns records into [`Event`]s with a [`TraceMeta`]'s formats and thread names; what
/// the [`Reader`] uses for files and a live reader (`ustrace stream`) uses for pages read
/// from `trace_pipe_raw`.
#[derive(Clone, Debug, Default)]
pub struct Decoder {
    formats: HashMap<u16, Arc<EventFormat>>,
    cmdlines: HashMap<i32, String>,
    tgids: HashMap<i32, i32>,
}

impl Decoder {
    /// A decoder for the formats and threads of `meta`.
    pub fn new(meta: &TraceMeta) -> io::Result<Decoder> {
        let mut formats = HashMap::new();
        for f in meta.formats()? {
            formats.insert(f.id, Arc::new(f));
        }
        Ok(Decoder {
            formats,
            cmdlines: meta.cmdlines(),
            tgids: meta.tgids(),
        })
    }

    /// Takes newer thread names and thread groups (a live reader re-reads them).
    pub fn update_threads(&mut self, meta: &TraceMeta) {
        self.cmdlines = meta.cmdlines();
        self.tgids = meta.tgids();
    }

    /// Every format known.
    pub fn formats(&self) -> impl Iterator<Item = &Arc<EventFormat>> {
        self.formats.values()
    }

    /// Decodes one record (`data`: common header first) of `cpu` at `ts`.
    pub fn decode(&self, cpu: u32, ts: u64, data: &[u8], missed_events: i64) -> Event {
        decode_event(
            &self.formats,
            &self.cmdlines,
            &self.tgids,
            cpu,
            ts,
            data,
            missed_events,
        )
    }
}

/// The most of a file read to find its headers: they end before the first page, and no
/// trace-cmd writes more than a few MiB of formats.
const MAX_HEAD: u64 = 256 << 20;

/// A parsed file, before it is given its bytes.
struct Parsed {
    meta: TraceMeta,
    layout: PageLayout,
    decoder: Decoder,
    cpu_data: Vec<(u64, u64)>,
    cpu_stats: Vec<(usize, String)>,
    version: u32,
    options: Vec<(u16, Vec<u8>)>,
}

/// What the version-specific parts of a file give.
#[derive(Default)]
struct Parts {
    header_page: Vec<u8>,
    header_event: Vec<u8>,
    ftrace_formats: Vec<Vec<u8>>,
    event_formats: Vec<(String, Vec<Vec<u8>>)>,
    kallsyms: Vec<u8>,
    printk_formats: Vec<u8>,
    saved_cmdlines: Vec<u8>,
    options: Vec<(u16, Vec<u8>)>,
    /// Offset and size of each CPU's pages, by CPU number.
    cpu_data: Vec<(u64, u64)>,
    /// The CPU count the file states (v6's header).
    cpus: usize,
    /// The clock stored outside the options (v6 after the CPU table, v7 in BUFFER).
    clock: Option<String>,
}

fn header_info(c: &mut Cursor<'_>, p: &mut Parts) -> io::Result<()> {
    if c.take(12, "header_page")? != b"header_page\0" {
        return Err(bad("trace.dat: header_page missing"));
    }
    p.header_page = c.block8("header_page")?.to_vec();
    if c.take(13, "header_event")? != b"header_event\0" {
        return Err(bad("trace.dat: header_event missing"));
    }
    p.header_event = c.block8("header_event")?.to_vec();
    Ok(())
}

fn ftrace_formats(c: &mut Cursor<'_>) -> io::Result<Vec<Vec<u8>>> {
    let n = c.count("ftrace formats", 8)?;
    (0..n)
        .map(|_| Ok(c.block8("ftrace format")?.to_vec()))
        .collect()
}

fn event_formats(c: &mut Cursor<'_>) -> io::Result<Vec<(String, Vec<Vec<u8>>)>> {
    let n = c.count("event systems", 5)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let system = c.cstr("system name")?;
        let k = c.count("event formats", 8)?;
        let formats = (0..k)
            .map(|_| Ok(c.block8("event format")?.to_vec()))
            .collect::<io::Result<Vec<_>>>()?;
        out.push((system, formats));
    }
    Ok(out)
}

fn check_cpu_data(cpu: usize, offset: u64, size: u64, file_len: u64) -> io::Result<()> {
    if offset.checked_add(size).is_none_or(|end| end > file_len) {
        return Err(bad(format!(
            "trace.dat truncated: cpu {cpu} data at {offset}+{size} past the end {file_len}"
        )));
    }
    Ok(())
}

/// Version 6: everything in a fixed order, then the CPU table.
fn parse_v6(c: &mut Cursor<'_>, file_len: u64) -> io::Result<Parts> {
    let mut p = Parts::default();
    header_info(c, &mut p)?;
    p.ftrace_formats = ftrace_formats(c)?;
    p.event_formats = event_formats(c)?;
    p.kallsyms = c.block4("kallsyms")?.to_vec();
    p.printk_formats = c.block4("printk formats")?.to_vec();
    p.saved_cmdlines = c.block8("saved_cmdlines")?.to_vec();
    p.cpus = c.count("cpus", 16)?;
    let mut label = c.take(10, "section label")?;
    if label == b"options  \0" {
        loop {
            let id = c.u16("option id")?;
            if id == option::DONE {
                break;
            }
            let data = c.block4("option")?.to_vec();
            p.options.push((id, data));
        }
        label = c.take(10, "section label")?;
    }
    if label == b"latency  \0" {
        return Err(bad("latency-format trace.dat files hold text, not events"));
    }
    if label != b"flyrecord\0" {
        return Err(bad("trace.dat: no flyrecord section"));
    }
    for cpu in 0..p.cpus {
        let offset = c.u64("cpu table")?;
        let size = c.u64("cpu table")?;
        check_cpu_data(cpu, offset, size, file_len)?;
        p.cpu_data.push((offset, size));
    }
    if p.options.iter().any(|(id, _)| *id == option::TRACECLOCK) {
        // Version 6 repeats the clock after the CPU table.
        if let Ok(text) = c.block8("trace clock") {
            p.clock = selected_clock(&String::from_utf8_lossy(text));
        }
    }
    Ok(p)
}

/// Checks the header of the section at `offset` (id `want`, not compressed, inside the
/// file); the size of its body.
fn section_header(file: &Backing, file_len: u64, offset: u64, want: u16) -> io::Result<u64> {
    let mut head = [0u8; 16];
    if offset.checked_add(16).is_none_or(|end| end > file_len) {
        return Err(bad(format!("trace.dat: section at {offset} past the end")));
    }
    file.read_exact_at(&mut head, offset)?;
    let id = u16::from_le_bytes([head[0], head[1]]);
    let flags = u16::from_le_bytes([head[2], head[3]]);
    let mut size = [0u8; 8];
    size.copy_from_slice(&head[8..16]);
    let size = u64::from_le_bytes(size);
    if id != want {
        return Err(bad(format!(
            "trace.dat: section at {offset} is {id}, expected {want}"
        )));
    }
    if flags & 1 != 0 {
        return Err(bad("compressed trace.dat sections are not supported \
             (trace-cmd convert --compression none makes a readable copy)"));
    }
    if (offset + 16)
        .checked_add(size)
        .is_none_or(|end| end > file_len)
    {
        return Err(bad(format!(
            "trace.dat: section at {offset} runs past the end"
        )));
    }
    Ok(size)
}

/// Reads the body of the section at `offset` (see [`section_header`]).
fn section(file: &Backing, file_len: u64, offset: u64, want: u16) -> io::Result<Vec<u8>> {
    let size = section_header(file, file_len, offset, want)?;
    let mut data = vec![0u8; size as usize];
    file.read_exact_at(&mut data, offset + 16)?;
    Ok(data)
}

fn offset_of(data: &[u8]) -> io::Result<u64> {
    let b: [u8; 8] = data
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| bad("trace.dat: short offset option"))?;
    Ok(u64::from_le_bytes(b))
}

/// Version 7: sections anywhere, found through chained options sections.
fn parse_v7(c: &mut Cursor<'_>, file_len: u64, file: &Backing) -> io::Result<Parts> {
    let algorithm = c.cstr("compression")?;
    let _version = c.cstr("compression version")?;
    if algorithm != "none" {
        return Err(bad(format!(
            "trace.dat compressed with {algorithm} is not supported \
             (trace-cmd convert --compression none makes a readable copy)"
        )));
    }
    let mut p = Parts::default();
    let mut next = c.u64("options offset")?;
    let mut seen = Vec::new();
    while next != 0 {
        if seen.contains(&next) || seen.len() > 1024 {
            return Err(bad("trace.dat: options sections form a loop"));
        }
        seen.push(next);
        let data = section(file, file_len, next, option::DONE)?;
        let mut oc = Cursor { buf: &data, pos: 0 };
        loop {
            let id = oc.u16("option id")?;
            let body = oc.block4("option")?;
            if id == option::DONE {
                next = offset_of(body)?;
                break;
            }
            p.options.push((id, body.to_vec()));
        }
    }
    let find = |id: u16| {
        p.options
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, d)| offset_of(d))
            .transpose()
    };
    let header_at = find(option::HEADER_INFO)?
        .ok_or_else(|| bad("trace.dat: no header_page/header_event section"))?;
    let data = section(file, file_len, header_at, option::HEADER_INFO)?;
    let mut parts = Parts::default();
    header_info(&mut Cursor { buf: &data, pos: 0 }, &mut parts)?;
    if let Some(at) = find(option::FTRACE_EVENTS)? {
        let data = section(file, file_len, at, option::FTRACE_EVENTS)?;
        parts.ftrace_formats = ftrace_formats(&mut Cursor { buf: &data, pos: 0 })?;
    }
    if let Some(at) = find(option::EVENT_FORMATS)? {
        let data = section(file, file_len, at, option::EVENT_FORMATS)?;
        parts.event_formats = event_formats(&mut Cursor { buf: &data, pos: 0 })?;
    }
    if let Some(at) = find(option::KALLSYMS)? {
        let data = section(file, file_len, at, option::KALLSYMS)?;
        parts.kallsyms = Cursor { buf: &data, pos: 0 }.block4("kallsyms")?.to_vec();
    }
    if let Some(at) = find(option::PRINTK)? {
        let data = section(file, file_len, at, option::PRINTK)?;
        parts.printk_formats = Cursor { buf: &data, pos: 0 }.block4("printk")?.to_vec();
    }
    if let Some(at) = find(option::CMDLINES)? {
        let data = section(file, file_len, at, option::CMDLINES)?;
        parts.saved_cmdlines = Cursor { buf: &data, pos: 0 }.block8("cmdlines")?.to_vec();
    }
    // The top instance's buffer (name ""): its clock and each CPU's pages.
    for (id, data) in &p.options {
        if *id != option::BUFFER {
            continue;
        }
        let mut bc = Cursor { buf: data, pos: 0 };
        let at = bc.u64("buffer offset")?;
        let name = bc.cstr("buffer name")?;
        if !name.is_empty() {
            continue;
        }
        let clock = bc.cstr("buffer clock")?;
        let _page_size = bc.u32("buffer page size")?;
        let n = bc.count("buffer cpus", 20)?;
        // Only the header: the section's body is the pages, read page by page later.
        section_header(file, file_len, at, option::BUFFER)?;
        for _ in 0..n {
            let cpu = bc.u32("buffer cpu")? as usize;
            let offset = bc.u64("buffer cpu offset")?;
            let size = bc.u64("buffer cpu size")?;
            if cpu >= 4096 {
                return Err(bad(format!("trace.dat: cpu {cpu} out of range")));
            }
            check_cpu_data(cpu, offset, size, file_len)?;
            if parts.cpu_data.len() <= cpu {
                parts.cpu_data.resize(cpu + 1, (0, 0));
            }
            parts.cpu_data[cpu] = (offset, size);
        }
        parts.clock = Some(clock);
    }
    parts.options = p.options;
    Ok(parts)
}

struct CpuCursor {
    next: u64,
    end: u64,
    page: Vec<u8>,
    decoded: DecodedPage,
    idx: usize,
}

struct Events<'a> {
    reader: &'a Reader,
    cpus: Vec<CpuCursor>,
}

impl CpuCursor {
    /// Makes the head record available; `Some(Err)` when a page failed to load (it is
    /// skipped), `None` at the end of this CPU's data.
    fn fill(&mut self, reader: &Reader, cpu: usize) -> Option<io::Result<()>> {
        while self.idx >= self.decoded.records.len() {
            if self.next >= self.end {
                return None;
            }
            let size = reader.layout.page_size;
            let at = self.next;
            self.next = self.next.saturating_add(size as u64);
            self.page.resize(size, 0);
            let take = (self.end - at).min(size as u64) as usize;
            self.page[take..].fill(0);
            if let Err(e) = reader.file.read_exact_at(&mut self.page[..take], at) {
                self.next = self.end;
                return Some(Err(e));
            }
            self.idx = 0;
            match decode_page(&self.page, &reader.layout) {
                Ok(d) => self.decoded = d,
                Err(e) => {
                    self.decoded = DecodedPage::default();
                    return Some(Err(bad(format!(
                        "cpu {cpu}, page at file offset {at}: {e}"
                    ))));
                }
            }
        }
        Some(Ok(()))
    }
}

impl Iterator for Events<'_> {
    type Item = io::Result<Event>;

    fn next(&mut self) -> Option<io::Result<Event>> {
        let mut best: Option<(u64, usize)> = None;
        for cpu in 0..self.cpus.len() {
            match self.cpus[cpu].fill(self.reader, cpu) {
                None => continue,
                Some(Err(e)) => return Some(Err(e)),
                Some(Ok(())) => {}
            }
            let c = &self.cpus[cpu];
            let ts = c.decoded.records[c.idx].ts;
            if best.is_none_or(|(t, _)| ts < t) {
                best = Some((ts, cpu));
            }
        }
        let (_, cpu) = best?;
        let c = &mut self.cpus[cpu];
        let rec = c.decoded.records[c.idx];
        let missed = if c.idx == 0 {
            match (c.decoded.missed, c.decoded.missed_unknown) {
                (Some(n), _) => i64::try_from(n).unwrap_or(i64::MAX),
                (None, true) => -1,
                _ => 0,
            }
        } else {
            0
        };
        c.idx += 1;
        let data = &c.page[rec.start..rec.start + rec.len];
        Some(Ok(self.reader.decode(cpu as u32, rec.ts, data, missed)))
    }
}

fn int_at(data: &[u8], off: usize, size: usize, signed: bool) -> Option<Value> {
    let b = data.get(off..off.checked_add(size)?)?;
    let mut a = [0u8; 8];
    match size {
        1 | 2 | 4 | 8 => a[..size].copy_from_slice(b),
        _ => return None,
    }
    let raw = u64::from_le_bytes(a);
    Some(if signed {
        let shift = 64 - 8 * size as u32;
        Value::Int(((raw << shift) as i64) >> shift)
    } else {
        Value::UInt(raw)
    })
}

fn cstring(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The bytes of a `__data_loc` (or `__rel_loc`) field.
pub(crate) fn loc_bytes<'d>(data: &'d [u8], field: &Field) -> Option<&'d [u8]> {
    let word = match int_at(data, field.offset, 4, false)? {
        Value::UInt(w) => w as u32,
        _ => return None,
    };
    let mut start = (word & 0xffff) as usize;
    let len = (word >> 16) as usize;
    if field.ty == FieldType::RelString {
        start += field.offset + field.size;
    }
    data.get(start..start.checked_add(len)?)
}

/// The value of `field` in `data`.
pub fn field_value(data: &[u8], field: &Field) -> Value {
    let off = field.offset;
    match field.ty {
        FieldType::Int | FieldType::Pointer => {
            int_at(data, off, field.size, field.signed).unwrap_or(Value::Bytes(Vec::new()))
        }
        FieldType::CharArray => Value::Str(cstring(
            data.get(off..off.saturating_add(field.size)).unwrap_or(&[]),
        )),
        FieldType::TailString => Value::Str(cstring(data.get(off..).unwrap_or(&[]))),
        FieldType::DynString | FieldType::RelString => {
            Value::Str(cstring(loc_bytes(data, field).unwrap_or(&[])))
        }
        FieldType::DynArray => Value::Bytes(loc_bytes(data, field).unwrap_or(&[]).to_vec()),
        FieldType::IntArray { elem_size, len } => Value::Array(
            (0..len)
                .map_while(
                    |i| match int_at(data, off + i * elem_size, elem_size, false) {
                        Some(Value::UInt(v)) => Some(v),
                        _ => None,
                    },
                )
                .collect(),
        ),
    }
}

fn decode_event(
    formats: &HashMap<u16, Arc<EventFormat>>,
    cmdlines: &HashMap<i32, String>,
    tgids: &HashMap<i32, i32>,
    cpu: u32,
    ts: u64,
    data: &[u8],
    missed_events: i64,
) -> Event {
    let u = |off: usize, size: usize| match int_at(data, off, size, false) {
        Some(Value::UInt(v)) => v,
        _ => 0,
    };
    let id = u(0, 2) as u16;
    let format = formats.get(&id);
    let (flags, preempt, pid) = match format {
        Some(f) => {
            let at = |name: &str, default: (usize, usize)| {
                f.common_field(name)
                    .map_or(default, |fl| (fl.offset, fl.size))
            };
            let (fo, fs) = at("common_flags", (2, 1));
            let (po, ps) = at("common_preempt_count", (3, 1));
            let (io, is) = at("common_pid", (4, 4));
            (u(fo, fs) as u8, u(po, ps) as u8, u(io, is) as u32 as i32)
        }
        None => (u(2, 1) as u8, u(3, 1) as u8, u(4, 4) as u32 as i32),
    };
    let comm = match cmdlines.get(&pid) {
        Some(c) => c.clone(),
        None if pid == 0 => "<idle>".to_string(),
        None => "<...>".to_string(),
    };
    let fields = format.map_or_else(Vec::new, |f| {
        f.fields
            .iter()
            .map(|fl| (fl.name.clone(), field_value(data, fl)))
            .collect()
    });
    Event {
        cpu,
        ts,
        pid,
        tgid: tgids.get(&pid).copied(),
        comm,
        id,
        system: format.map_or_else(String::new, |f| f.system.clone()),
        name: format.map_or_else(String::new, |f| f.name.clone()),
        flags,
        preempt,
        fields,
        missed_events,
        data: data.to_vec(),
    }
}
