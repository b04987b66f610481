//! The kernel's ring-buffer page ("sub-buffer") format, byte for byte.
//!
//! Every per-CPU buffer is an array of 4096-byte pages laid out exactly as
//! the kernel lays out the pages it hands to `per_cpu/cpuN/trace_pipe_raw`
//! readers (see `events/header_page` and `events/header_event` in tracefs),
//! so libtraceevent's `kbuffer` can parse what we write:
//!
//! ```text
//!  page (4096 bytes)
//!  +----------------+----------------+------------------------------------+
//!  | u64 timestamp  | u64 commit     | data[4080]: events, back to back   |
//!  +----------------+----------------+------------------------------------+
//!    base time of     bytes of data     each event starts with a u32:
//!    the first event  (+ flag bits)     type_len:5 | time_delta:27
//!
//!  type_len 1..=28   data event, payload = type_len*4 bytes after the header
//!  type_len 0        data event, u32 array[0] = payload bytes + 4, payload after it
//!  type_len 29       padding: time_delta 0 = "rest of page is empty";
//!                    time_delta != 0 = a discarded event of array[0]+4 bytes
//!  type_len 30       time extend: adds (array[0] << 27 | time_delta) to the clock
//!  type_len 31       absolute time stamp (we decode it, never write it)
//! ```
//!
//! Timestamps are cumulative: the page header holds the absolute time of the
//! page start, and each event's `time_delta` is relative to the previous
//! event. A gap that does not fit 27 bits is carried by a time-extend event
//! written just before the data event.
//!
//! Worked example — events at t=1000 (8 bytes), t=1005 (200 bytes) and
//! t=1005+2^28 (4 bytes) on a page whose base is 1000 (an 8-byte payload
//! would make a 12-byte event, which the kernel grows to 16):
//!
//! ```text
//!  off 0   hdr(type_len=3, delta=0)            payload[8] + 4 zero bytes
//!  off 16  hdr(type_len=0, delta=5) array=204  payload[200]
//!  off 224 hdr(type_len=30, delta=0) array=2   (extend by 2<<27 = 2^28)
//!  off 232 hdr(type_len=1, delta=0)            payload[4]
//! ```
//!
//! The encoder side is a set of small functions used by the lock-free writer
//! (which must write each event's bytes independently of the others) plus
//! [`PageWriter`], a sequential builder used by tests and by readers that
//! re-pack partly consumed pages. [`PageDecoder`] walks one page and yields
//! events with absolute timestamps.

/// Size of one sub-buffer page, header included.
pub const PAGE_SIZE: usize = 4096;
/// Size of the page header (`u64 timestamp`, `u64 commit`).
pub const PAGE_HEADER_SIZE: usize = 16;
/// Bytes of event data one page holds.
pub const DATA_SIZE: usize = PAGE_SIZE - PAGE_HEADER_SIZE;
/// Padding event (`type_len` 29).
pub const TYPE_PADDING: u32 = 29;
/// Time-extend event (`type_len` 30).
pub const TYPE_TIME_EXTEND: u32 = 30;
/// Absolute time-stamp event (`type_len` 31).
pub const TYPE_TIME_STAMP: u32 = 31;
/// Largest `type_len` that still encodes the payload length in the header.
pub const TYPE_DATA_MAX: u32 = 28;
/// Bits of `time_delta` in an event header.
pub const TS_SHIFT: u32 = 27;
/// Mask of the 27-bit delta.
pub const TS_MASK: u64 = (1 << TS_SHIFT) - 1;
/// Largest payload stored without the `array[0]` length word.
pub const MAX_SMALL_DATA: usize = TYPE_DATA_MAX as usize * 4;
/// Size of a time-extend event.
pub const TIME_EXTEND_SIZE: usize = 8;
/// Largest payload one event can carry (a whole page minus the two header words).
pub const MAX_PAYLOAD: usize = DATA_SIZE - 8;
/// `commit` flag: events were lost between the previous page and this one.
pub const MISSED_EVENTS: u64 = 1 << 31;
/// `commit` flag: the number of lost events is stored as a u64 right after the data.
pub const MISSED_STORED: u64 = 1 << 30;
/// Mask of the byte count in `commit` (kbuffer uses the low 27 bits... we are generous).
pub const COMMIT_MASK: u64 = (1 << 30) - 1;

/// Total bytes (header included, 4-aligned) an event with `len` payload bytes
/// takes in a page — the kernel's length rules, including its quirks: an empty
/// payload is stored as 4 bytes, and a 12-byte event is grown to 16.
#[inline]
pub const fn event_size(len: usize) -> usize {
    let len = if len == 0 { 1 } else { len };
    let mut total = if len > MAX_SMALL_DATA {
        len + 8
    } else {
        len + 4
    };
    total = (total + 3) & !3;
    if total == TIME_EXTEND_SIZE + 4 {
        total += 4;
    }
    total
}

/// Offset of the payload inside an event of `total` bytes (4 or 8).
#[inline]
pub const fn payload_offset(total: usize) -> usize {
    if total - 4 > MAX_SMALL_DATA {
        8
    } else {
        4
    }
}

/// Builds an event header word.
#[inline]
pub const fn header_word(type_len: u32, delta: u32) -> u32 {
    (type_len & 0x1f) | (delta << 5)
}

/// Writes the header (and the `array[0]` length word for large events) of a
/// data event of `total` bytes (from [`event_size`]) with a delta below 2^27.
/// Returns the payload offset.
///
/// # Panics
/// If `buf` is shorter than 8 bytes.
// Always inlined: with a length known only at run time (a dynamic event's), the reserve
// fast path otherwise called it, spilling the reservation around the call.
#[inline(always)]
pub fn write_data_header(buf: &mut [u8], total: usize, delta: u32) -> usize {
    debug_assert!(u64::from(delta) <= TS_MASK);
    let body = total - 4;
    if body > MAX_SMALL_DATA {
        buf[0..4].copy_from_slice(&header_word(0, delta).to_ne_bytes());
        buf[4..8].copy_from_slice(&(body as u32).to_ne_bytes());
        8
    } else {
        buf[0..4].copy_from_slice(&header_word((body / 4) as u32, delta).to_ne_bytes());
        4
    }
}

/// Writes an 8-byte time-extend event carrying `delta` (up to 59 bits).
#[inline]
pub fn write_time_extend(buf: &mut [u8], delta: u64) {
    let low = (delta & TS_MASK) as u32;
    let high = (delta >> TS_SHIFT) as u32;
    buf[0..4].copy_from_slice(&header_word(TYPE_TIME_EXTEND, low).to_ne_bytes());
    buf[4..8].copy_from_slice(&high.to_ne_bytes());
}

/// Fills `buf` (the unused tail of a page, a multiple of 4 bytes) with the
/// end-of-page padding the kernel writes: a sized padding event when there
/// is room for its length word, else a bare null event.
#[inline]
pub fn write_end_padding(buf: &mut [u8]) {
    let rem = buf.len();
    if rem >= 8 {
        buf[0..4].copy_from_slice(&header_word(TYPE_PADDING, 1).to_ne_bytes());
        buf[4..8].copy_from_slice(&((rem - 4) as u32).to_ne_bytes());
    } else if rem >= 4 {
        buf[0..4].copy_from_slice(&header_word(TYPE_PADDING, 0).to_ne_bytes());
    }
}

/// Turns the `total` bytes of a reserved event into a discarded event, as
/// the kernel does: a padding record whose `time_delta` carries the event's
/// delta (readers add it, so later events keep their times) and whose
/// `array[0]` gives its length. A delta of 0 must be written as 1 (0 marks
/// the end of the page), which moves later times on the page by 1 ns — the
/// kernel's behaviour too. With `extend`, the first 8 bytes are the event's
/// time extend; it keeps all of the delta but the 1 the padding carries.
#[inline]
pub fn write_discarded(buf: &mut [u8], total: usize, delta: u64, extend: bool) {
    let (at, pad_delta) = if extend {
        write_time_extend(buf, delta - 1);
        (TIME_EXTEND_SIZE, 1)
    } else {
        debug_assert!(delta <= TS_MASK);
        (0, delta.max(1) as u32)
    };
    let size = total - at;
    buf[at..at + 4].copy_from_slice(&header_word(TYPE_PADDING, pad_delta).to_ne_bytes());
    buf[at + 4..at + 8].copy_from_slice(&((size - 4) as u32).to_ne_bytes());
}

/// Reads a native-endian u32 at `off`.
#[inline]
pub fn read_u32(buf: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]])
}

/// Reads a native-endian u64 at `off`.
#[inline]
pub fn read_u64(buf: &[u8], off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[off..off + 8]);
    u64::from_ne_bytes(b)
}

/// What one record in a page is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A data event; payload at `offset + payload_offset`, `payload_len` bytes.
    Data {
        /// Offset of the payload from the record start.
        payload_offset: usize,
        /// Payload bytes (4-aligned, as the kernel reports them).
        payload_len: usize,
    },
    /// A time extend or absolute time stamp (already applied to `ts`).
    Time,
    /// A discarded event (padding with a non-zero delta that is not the page end).
    Discarded,
    /// Padding that runs to the end of the page data.
    EndPadding,
}

/// One record of a page as the decoder sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Offset of the record inside the page data area.
    pub offset: usize,
    /// Total size in bytes (to the end of data for [`RecordKind::EndPadding`]).
    pub size: usize,
    /// Absolute timestamp after applying this record's delta.
    pub ts: u64,
    /// What the record is.
    pub kind: RecordKind,
}

/// Why a page could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageError {
    /// The buffer is not a whole page.
    BadLength(usize),
    /// The header's commit count exceeds the data area.
    BadCommit(u64),
    /// A record at `offset` runs past the committed data.
    Truncated {
        /// Offset of the bad record.
        offset: usize,
    },
}

impl std::fmt::Display for PageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PageError::BadLength(n) => write!(f, "page is {n} bytes, expected {PAGE_SIZE}"),
            PageError::BadCommit(c) => write!(f, "commit {c} exceeds page data size {DATA_SIZE}"),
            PageError::Truncated { offset } => {
                write!(f, "record at offset {offset} runs past the committed data")
            }
        }
    }
}

impl std::error::Error for PageError {}

/// Walks the records of one raw page. Iterating yields data events only
/// ([`PageEvent`]); [`PageDecoder::next_record`] yields every record.
#[derive(Debug, Clone)]
pub struct PageDecoder<'a> {
    data: &'a [u8],
    limit: usize,
    off: usize,
    ts: u64,
    missed: Option<u64>,
    failed: bool,
}

/// A data event decoded from a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageEvent<'a> {
    /// Absolute timestamp.
    pub ts: u64,
    /// Offset of the event header inside the page data area.
    pub offset: usize,
    /// The payload (4-aligned length).
    pub data: &'a [u8],
}

impl<'a> PageDecoder<'a> {
    /// Decodes a page produced for readers: header timestamp and commit
    /// (with the missed-events flags) are taken from the page itself.
    pub fn new(page: &'a [u8]) -> Result<Self, PageError> {
        if page.len() != PAGE_SIZE {
            return Err(PageError::BadLength(page.len()));
        }
        let ts = read_u64(page, 0);
        let commit = read_u64(page, 8);
        let len = commit & COMMIT_MASK;
        if len as usize > DATA_SIZE {
            return Err(PageError::BadCommit(len));
        }
        let data = &page[PAGE_HEADER_SIZE..];
        let mut missed = None;
        if commit & MISSED_EVENTS != 0 {
            missed = Some(0);
            if commit & MISSED_STORED != 0 && len as usize + 8 <= DATA_SIZE {
                missed = Some(read_u64(data, len as usize));
            }
        }
        Ok(PageDecoder {
            data,
            limit: len as usize,
            off: 0,
            ts,
            missed,
            failed: false,
        })
    }

    /// Decodes the first `limit` bytes of a page's data area, with `base_ts`
    /// as the page start time (the header's commit field is ignored). Used on
    /// live pages whose commit word is kept elsewhere.
    pub fn with_limit(page: &'a [u8], limit: usize, base_ts: u64) -> Self {
        let data = &page[PAGE_HEADER_SIZE..];
        PageDecoder {
            data,
            limit: limit.min(DATA_SIZE),
            off: 0,
            ts: base_ts,
            missed: None,
            failed: false,
        }
    }

    /// Continues decoding at `offset` (a record boundary found by an earlier
    /// decode of the same page) where the clock reads `ts`.
    pub fn resume(page: &'a [u8], limit: usize, offset: usize, ts: u64) -> Self {
        let mut d = Self::with_limit(page, limit, ts);
        d.off = offset;
        d
    }

    /// The page's base timestamp or, after some records, the time of the last one.
    pub fn ts(&self) -> u64 {
        self.ts
    }

    /// Offset of the next record.
    pub fn offset(&self) -> usize {
        self.off
    }

    /// Bytes of data the decoder reads.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Lost events flagged in the header: `Some(n)` when flagged, where `n`
    /// is the stored count or 0 when the count was not stored.
    pub fn missed_events(&self) -> Option<u64> {
        self.missed
    }

    /// Whether decoding stopped on a malformed record.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The next record, or `None` at the end of the data (or on a malformed record,
    /// see [`PageDecoder::failed`]).
    pub fn next_record(&mut self) -> Option<Record> {
        let off = self.off;
        if self.failed || off + 4 > self.limit {
            return None;
        }
        let word = read_u32(self.data, off);
        let type_len = word & 0x1f;
        let delta = u64::from(word >> 5);
        let rest = self.limit - off;
        let (size, kind) = match type_len {
            TYPE_PADDING => {
                if delta == 0 {
                    (rest, RecordKind::EndPadding)
                } else {
                    if rest < 8 {
                        return self.fail();
                    }
                    let size = read_u32(self.data, off + 4) as usize + 4;
                    if size < 8 || size > rest {
                        return self.fail();
                    }
                    if off + size == DATA_SIZE {
                        (size, RecordKind::EndPadding)
                    } else {
                        // A discarded event: its delta still counts (as kbuffer does).
                        self.ts = self.ts.wrapping_add(delta);
                        (size, RecordKind::Discarded)
                    }
                }
            }
            TYPE_TIME_EXTEND => {
                if rest < 8 {
                    return self.fail();
                }
                let high = u64::from(read_u32(self.data, off + 4));
                self.ts = self.ts.wrapping_add((high << TS_SHIFT) | delta);
                (8, RecordKind::Time)
            }
            TYPE_TIME_STAMP => {
                if rest < 8 {
                    return self.fail();
                }
                let high = u64::from(read_u32(self.data, off + 4));
                let abs = (high << TS_SHIFT) | delta;
                let keep = !((1u64 << 59) - 1);
                self.ts = (self.ts & keep) | abs;
                (8, RecordKind::Time)
            }
            0 => {
                if rest < 8 {
                    return self.fail();
                }
                let body = read_u32(self.data, off + 4) as usize;
                let size = (body + 4 + 3) & !3;
                if body < 4 || size > rest {
                    return self.fail();
                }
                self.ts = self.ts.wrapping_add(delta);
                (
                    size,
                    RecordKind::Data {
                        payload_offset: 8,
                        payload_len: (body - 4 + 3) & !3,
                    },
                )
            }
            n => {
                let size = 4 + n as usize * 4;
                if size > rest {
                    return self.fail();
                }
                self.ts = self.ts.wrapping_add(delta);
                (
                    size,
                    RecordKind::Data {
                        payload_offset: 4,
                        payload_len: n as usize * 4,
                    },
                )
            }
        };
        self.off = off + size;
        Some(Record {
            offset: off,
            size,
            ts: self.ts,
            kind,
        })
    }

    fn fail(&mut self) -> Option<Record> {
        self.failed = true;
        None
    }
}

impl<'a> Iterator for PageDecoder<'a> {
    type Item = PageEvent<'a>;

    fn next(&mut self) -> Option<PageEvent<'a>> {
        loop {
            let rec = self.next_record()?;
            if let RecordKind::Data {
                payload_offset,
                payload_len,
            } = rec.kind
            {
                let start = rec.offset + payload_offset;
                return Some(PageEvent {
                    ts: rec.ts,
                    offset: rec.offset,
                    data: &self.data[start..start + payload_len],
                });
            }
            if rec.kind == RecordKind::EndPadding {
                return None;
            }
        }
    }
}

/// Builds one page sequentially (tests, and readers re-packing a partly
/// consumed page). Timestamps passed to [`PageWriter::push`] must not go
/// backwards.
#[derive(Debug, Clone)]
pub struct PageWriter {
    page: Vec<u8>,
    off: usize,
    last_ts: u64,
    entries: usize,
}

impl PageWriter {
    /// A new empty page whose base time is `base_ts`.
    pub fn new(base_ts: u64) -> Self {
        let mut page = vec![0u8; PAGE_SIZE];
        page[0..8].copy_from_slice(&base_ts.to_ne_bytes());
        PageWriter {
            page,
            off: 0,
            last_ts: base_ts,
            entries: 0,
        }
    }

    /// Bytes of data written so far.
    pub fn len(&self) -> usize {
        self.off
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.off == 0
    }

    /// Data events written.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Bytes that recording an event of `len` payload bytes at `ts` would take.
    pub fn cost(&self, ts: u64, len: usize) -> usize {
        let delta = ts.saturating_sub(self.last_ts);
        event_size(len) + if delta > TS_MASK { TIME_EXTEND_SIZE } else { 0 }
    }

    /// Appends an event; returns false (writing nothing) when it does not fit.
    ///
    /// # Panics
    /// If `ts` is before the previous event's time or `payload` exceeds [`MAX_PAYLOAD`].
    pub fn push(&mut self, ts: u64, payload: &[u8]) -> bool {
        assert!(ts >= self.last_ts, "timestamps must not go backwards");
        assert!(payload.len() <= MAX_PAYLOAD, "payload too large");
        let need = self.cost(ts, payload.len());
        if self.off + need > DATA_SIZE {
            return false;
        }
        let mut delta = ts - self.last_ts;
        let data = &mut self.page[PAGE_HEADER_SIZE..];
        let mut at = self.off;
        if delta > TS_MASK {
            write_time_extend(&mut data[at..], delta);
            at += TIME_EXTEND_SIZE;
            delta = 0;
        }
        let total = event_size(payload.len());
        let p = write_data_header(&mut data[at..], total, delta as u32);
        data[at + p..at + p + payload.len()].copy_from_slice(payload);
        self.off = at + total;
        self.last_ts = ts;
        self.entries += 1;
        true
    }

    /// Appends a discarded event of `len` payload bytes at `ts` (readers skip
    /// it; see [`write_discarded`] for its effect on time). Returns false
    /// when it does not fit.
    pub fn push_discarded(&mut self, ts: u64, len: usize) -> bool {
        assert!(ts >= self.last_ts, "timestamps must not go backwards");
        let delta = ts - self.last_ts;
        let extend = delta > TS_MASK;
        let total = event_size(len) + if extend { TIME_EXTEND_SIZE } else { 0 };
        if self.off + total > DATA_SIZE {
            return false;
        }
        let data = &mut self.page[PAGE_HEADER_SIZE..];
        write_discarded(&mut data[self.off..], total, delta, extend);
        self.off += total;
        // Readers see the discard's delta as at least 1.
        self.last_ts = if extend {
            ts
        } else {
            self.last_ts + delta.max(1)
        };
        true
    }

    /// Appends raw, already encoded records (used to re-pack the unread
    /// tail of a page). The caller vouches that `ts_after` is the clock
    /// after them.
    pub fn push_raw(&mut self, records: &[u8], entries: usize, ts_after: u64) -> bool {
        if self.off + records.len() > DATA_SIZE {
            return false;
        }
        let s = PAGE_HEADER_SIZE + self.off;
        self.page[s..s + records.len()].copy_from_slice(records);
        self.off += records.len();
        self.entries += entries;
        self.last_ts = ts_after;
        true
    }

    /// Finishes the page: `commit` = bytes written, plus the missed-events
    /// flags (the count is stored after the data when it fits).
    pub fn finish(mut self, missed: Option<u64>) -> Vec<u8> {
        let mut commit = self.off as u64;
        if let Some(n) = missed {
            commit |= MISSED_EVENTS;
            if self.off + 8 <= DATA_SIZE {
                let s = PAGE_HEADER_SIZE + self.off;
                self.page[s..s + 8].copy_from_slice(&n.to_ne_bytes());
                commit |= MISSED_STORED;
            }
        }
        self.page[8..16].copy_from_slice(&commit.to_ne_bytes());
        self.page
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes_follow_kernel_rules() {
        assert_eq!(event_size(0), 8);
        assert_eq!(event_size(1), 8);
        assert_eq!(event_size(4), 8);
        assert_eq!(event_size(5), 16); // 12 grown to 16
        assert_eq!(event_size(8), 16);
        assert_eq!(event_size(9), 16);
        assert_eq!(event_size(112), 116);
        assert_eq!(event_size(113), 124);
        assert_eq!(event_size(MAX_PAYLOAD), DATA_SIZE);
        assert_eq!(payload_offset(116), 4);
        assert_eq!(payload_offset(124), 8);
    }

    #[test]
    fn worked_example_from_module_doc() {
        let mut w = PageWriter::new(1000);
        assert!(w.push(1000, &[1; 8]));
        assert!(w.push(1005, &[2; 200]));
        assert!(w.push(1005 + (1 << 28), &[3; 4]));
        let page = w.finish(None);
        let d = &page[PAGE_HEADER_SIZE..];
        assert_eq!(read_u32(d, 0), header_word(3, 0)); // 8 bytes -> 12 -> grown to 16
        assert_eq!(read_u32(d, 16), header_word(0, 5));
        assert_eq!(read_u32(d, 20), 204);
        assert_eq!(read_u32(d, 224), header_word(TYPE_TIME_EXTEND, 0));
        assert_eq!(read_u32(d, 228), 2);
        let evs: Vec<_> = PageDecoder::new(&page).unwrap().collect();
        assert_eq!(evs.len(), 3);
        assert_eq!(evs[0].ts, 1000);
        assert_eq!(&evs[0].data[..8], &[1; 8]);
        assert_eq!(evs[1].ts, 1005);
        assert_eq!(evs[2].ts, 1005 + (1 << 28));
    }

    #[test]
    fn missed_events_flags() {
        let mut w = PageWriter::new(5);
        w.push(6, b"abcd");
        let page = w.finish(Some(42));
        let commit = read_u64(&page, 8);
        assert_eq!(commit & COMMIT_MASK, 8);
        assert_ne!(commit & MISSED_EVENTS, 0);
        assert_ne!(commit & MISSED_STORED, 0);
        assert_eq!(PageDecoder::new(&page).unwrap().missed_events(), Some(42));
    }

    #[test]
    fn malformed_pages_do_not_panic() {
        let mut page = vec![0xffu8; PAGE_SIZE];
        page[8..16].copy_from_slice(&(DATA_SIZE as u64).to_ne_bytes());
        let mut d = PageDecoder::new(&page).unwrap();
        while d.next_record().is_some() {}
        assert!(PageDecoder::new(&page[..10]).is_err());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Event { gap: u64, len: usize },
        Discard { gap: u64, len: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        let gap = prop_oneof![0u64..10, 0u64..(1 << 27), (1u64 << 26)..(1 << 40)];
        let len = prop_oneof![0usize..16, 0usize..200, 100usize..=MAX_PAYLOAD];
        prop_oneof![
            4 => (gap.clone(), len.clone()).prop_map(|(gap, len)| Op::Event { gap, len }),
            1 => (gap, len).prop_map(|(gap, len)| Op::Discard { gap, len }),
        ]
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(base in 0u64..(1 << 50), ops in proptest::collection::vec(op(), 0..60),
                                    missed in proptest::option::of(0u64..1000)) {
            let mut w = PageWriter::new(base);
            let mut ts = base;
            let mut expect = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                match *op {
                    Op::Event { gap, len } => {
                        let payload: Vec<u8> = (0..len).map(|b| (b as u8) ^ (i as u8)).collect();
                        if w.push(ts + gap, &payload) {
                            ts += gap;
                            expect.push((ts, payload));
                        }
                    }
                    Op::Discard { gap, len } => {
                        if w.push_discarded(ts + gap, len) {
                            // A zero gap is stored as 1, as the kernel does.
                            ts += gap.max(1);
                        }
                    }
                }
            }
            let used = w.len();
            let mut page = w.finish(missed);
            // The live writer pads the rest of the page; readers must stop there too.
            if missed.is_none() {
                write_end_padding(&mut page[PAGE_HEADER_SIZE + used..]);
                page[8..16].copy_from_slice(&(DATA_SIZE as u64).to_ne_bytes());
            }
            let dec = PageDecoder::new(&page).unwrap();
            prop_assert_eq!(dec.missed_events(), missed.map(|m| if used + 8 <= DATA_SIZE { m } else { 0 }));
            let got: Vec<_> = dec.collect();
            prop_assert_eq!(got.len(), expect.len());
            for (g, (ets, payload)) in got.iter().zip(&expect) {
                prop_assert_eq!(g.ts, *ets);
                prop_assert_eq!(g.data.len(), event_size(payload.len()) - payload_offset(event_size(payload.len())));
                prop_assert_eq!(&g.data[..payload.len()], &payload[..]);
                prop_assert!(g.data[payload.len()..].iter().all(|&b| b == 0));
            }
        }
    }
}
