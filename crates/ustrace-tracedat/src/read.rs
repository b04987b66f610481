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

/// Reads a trace.dat file.
pub struct Reader {
    file: File,
    meta: TraceMeta,
    layout: PageLayout,
    formats: HashMap<u16, Arc<EventFormat>>,
    cpu_data: Vec<(u64, u64)>,
    cpu_stats: Vec<(usize, String)>,
    cmdlines: HashMap<i32, String>,
    tgids: HashMap<i32, i32>,
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
            return Err(bad(format!(
                "trace.dat truncated in {what} (need {n} bytes at offset {})",
                self.pos
            )));
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
            return Err(bad(format!("trace.dat: {what} count {n} exceeds the file")));
        }
        Ok(n)
    }
}

impl Reader {
    /// Opens and parses the headers of `path`.
    pub fn open(path: &Path) -> io::Result<Reader> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        // The headers are read whole; they end before the first page, which for any
        // sane file is well under this bound. Pages are read one at a time later.
        let head_len = len.min(256 << 20) as usize;
        let mut head = vec![0u8; head_len];
        file.read_exact_at(&mut head, 0)?;
        Self::parse(&head, len, file)
    }

    /// Parses a whole file held in memory (the fuzz target's door), then reads events
    /// through a scratch file. `bytes` is the file.
    pub fn parse_bytes(bytes: &[u8], scratch: File) -> io::Result<Reader> {
        use std::io::Write;
        let mut f = scratch;
        f.set_len(0)?;
        f.write_all(bytes)?;
        Self::parse(bytes, bytes.len() as u64, f)
    }

    fn parse(head: &[u8], file_len: u64, file: File) -> io::Result<Reader> {
        let mut c = Cursor { buf: head, pos: 0 };
        if c.take(MAGIC.len(), "magic")? != MAGIC {
            return Err(bad("not a trace.dat file (bad magic)"));
        }
        let version: u32 = c
            .cstr("version")?
            .parse()
            .map_err(|_| bad("trace.dat: bad version string"))?;
        if version != 6 {
            return Err(bad(format!(
                "trace.dat version {version} is not supported (only 6)"
            )));
        }
        let endian = c.take(1, "endian")?[0];
        if endian != 0 {
            return Err(bad("big-endian trace.dat files are not supported"));
        }
        let _long_size = c.take(1, "long size")?[0];
        let page_size = c.u32("page size")?;
        if c.take(12, "header_page")? != b"header_page\0" {
            return Err(bad("trace.dat: header_page missing"));
        }
        let header_page = c.block8("header_page")?.to_vec();
        if c.take(13, "header_event")? != b"header_event\0" {
            return Err(bad("trace.dat: header_event missing"));
        }
        let header_event = c.block8("header_event")?.to_vec();
        let layout = PageLayout::parse(&String::from_utf8_lossy(&header_page))?;
        if layout.page_size != page_size as usize {
            return Err(bad(format!(
                "trace.dat: page size {page_size} but header_page describes {}",
                layout.page_size
            )));
        }
        let n = c.count("ftrace formats", 8)?;
        let mut ftrace_formats = Vec::with_capacity(n);
        for _ in 0..n {
            ftrace_formats.push(c.block8("ftrace format")?.to_vec());
        }
        let n = c.count("event systems", 5)?;
        let mut event_formats = Vec::with_capacity(n);
        for _ in 0..n {
            let system = c.cstr("system name")?;
            let k = c.count("event formats", 8)?;
            let mut v = Vec::with_capacity(k);
            for _ in 0..k {
                v.push(c.block8("event format")?.to_vec());
            }
            event_formats.push((system, v));
        }
        let kallsyms = c.block4("kallsyms")?.to_vec();
        let printk_formats = c.block4("printk formats")?.to_vec();
        let saved_cmdlines = c.block8("saved_cmdlines")?.to_vec();
        let cpus = c.count("cpus", 16)?;
        let mut options = Vec::new();
        let mut label = c.take(10, "section label")?;
        if label == b"options  \0" {
            loop {
                let id = c.u16("option id")?;
                if id == option::DONE {
                    break;
                }
                let data = c.block4("option")?.to_vec();
                options.push((id, data));
            }
            label = c.take(10, "section label")?;
        }
        if label == b"latency  \0" {
            return Err(bad("latency-format trace.dat files hold text, not events"));
        }
        if label != b"flyrecord\0" {
            return Err(bad("trace.dat: no flyrecord section"));
        }
        let mut cpu_data = Vec::with_capacity(cpus);
        for cpu in 0..cpus {
            let offset = c.u64("cpu table")?;
            let size = c.u64("cpu table")?;
            if offset.checked_add(size).is_none_or(|end| end > file_len) {
                return Err(bad(format!(
                    "trace.dat truncated: cpu {cpu} data at {offset}+{size} past the end {file_len}"
                )));
            }
            cpu_data.push((offset, size));
        }
        let mut trace_clock = "local".to_string();
        let mut cpu_stats = Vec::new();
        for (id, data) in &options {
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
                _ => {}
            }
        }
        if options.iter().any(|(id, _)| *id == option::TRACECLOCK) {
            // Version 6 repeats the clock after the CPU table.
            if let Ok(text) = c.block8("trace clock") {
                if let Some(clock) = selected_clock(&String::from_utf8_lossy(text)) {
                    trace_clock = clock;
                }
            }
        }
        let meta = TraceMeta {
            header_page,
            header_event,
            ftrace_formats,
            event_formats,
            kallsyms,
            printk_formats,
            saved_cmdlines,
            saved_tgids: Vec::new(),
            trace_clock,
            cpus,
            page_size,
        };
        let mut formats = HashMap::new();
        for f in meta.formats()? {
            formats.insert(f.id, Arc::new(f));
        }
        let cmdlines = meta.cmdlines();
        let tgids = meta.tgids();
        Ok(Reader {
            file,
            meta,
            layout,
            formats,
            cpu_data,
            cpu_stats,
            cmdlines,
            tgids,
            version,
            options,
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
        self.formats.get(&id)
    }

    /// Every event format in the file.
    pub fn formats(&self) -> impl Iterator<Item = &Arc<EventFormat>> {
        self.formats.values()
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
