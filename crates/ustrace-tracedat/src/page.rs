//! Decoding one ring-buffer page of a trace.dat: records with absolute timestamps.
//!
//! The pages in a trace.dat are the kernel's sub-buffers exactly as `trace_pipe_raw` gave
//! them (ustrace writes the same format, see `ustrace_ringbuf::page`). Their header layout
//! comes from the file's `header_page` (where the timestamp, the commit word and the data
//! start are, and how wide `long` is), and the record headers follow `header_event`
//! (`type_len:5 | time_delta:27`, padding 29, time extend 30, absolute time stamp 31).
//! Every length read from a page is checked against the page: the file is untrusted.

use std::io;

/// Where the parts of a page header are, from `events/header_page`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageLayout {
    /// Bytes per page (sub-buffer).
    pub page_size: usize,
    /// Offset of the u64 base timestamp.
    pub ts_offset: usize,
    /// Offset and size (4 or 8) of the commit word.
    pub commit_offset: usize,
    /// Size of the commit word (the kernel's `long`).
    pub commit_size: usize,
    /// Offset of the data area.
    pub data_offset: usize,
}

const COMMIT_MASK: u64 = (1 << 30) - 1;
const MISSED_EVENTS: u64 = 1 << 31;
const MISSED_STORED: u64 = 1 << 30;

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl PageLayout {
    /// The layout ustrace and 64-bit kernels use with 4096-byte pages.
    pub const DEFAULT: PageLayout = PageLayout {
        page_size: 4096,
        ts_offset: 0,
        commit_offset: 8,
        commit_size: 8,
        data_offset: 16,
    };

    /// Reads the layout from the text of `header_page`.
    pub fn parse(header_page: &str) -> io::Result<PageLayout> {
        let mut ts = None;
        let mut commit = None;
        let mut data = None;
        for line in header_page.lines() {
            let Some(rest) = line.trim().strip_prefix("field:") else {
                continue;
            };
            let mut decl = "";
            let (mut off, mut size) = (None, None);
            for part in rest.split(';').map(str::trim) {
                if let Some(v) = part.strip_prefix("offset:") {
                    off = v.parse::<usize>().ok();
                } else if let Some(v) = part.strip_prefix("size:") {
                    size = v.parse::<usize>().ok();
                } else if decl.is_empty() {
                    decl = part;
                }
            }
            let name = decl.rsplit(' ').next().unwrap_or("");
            match (name, off, size) {
                ("timestamp", Some(o), Some(8)) => ts = Some(o),
                ("commit", Some(o), Some(s)) if s == 4 || s == 8 => commit = Some((o, s)),
                ("data", Some(o), Some(s)) => data = Some((o, s)),
                _ => {}
            }
        }
        let (Some(ts_offset), Some((commit_offset, commit_size)), Some((data_offset, data_size))) =
            (ts, commit, data)
        else {
            return Err(bad("header_page lacks the timestamp, commit or data field"));
        };
        let page_size = data_offset + data_size;
        if !(64..=1 << 24).contains(&page_size)
            || ts_offset + 8 > data_offset
            || commit_offset + commit_size > data_offset
        {
            return Err(bad(format!(
                "header_page describes a bad page ({page_size} bytes)"
            )));
        }
        Ok(PageLayout {
            page_size,
            ts_offset,
            commit_offset,
            commit_size,
            data_offset,
        })
    }

    /// Bytes of the data area.
    pub fn data_size(&self) -> usize {
        self.page_size - self.data_offset
    }
}

/// One data record of a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRecord {
    /// Absolute timestamp (trace-clock units).
    pub ts: u64,
    /// Offset of the payload in the page.
    pub start: usize,
    /// Payload length (4-aligned, as the kernel reports it).
    pub len: usize,
}

/// A decoded page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecodedPage {
    /// The page's base timestamp.
    pub base_ts: u64,
    /// Events lost before this page, when the page stores their number.
    pub missed: Option<u64>,
    /// Events were lost before this page but their number was not stored.
    pub missed_unknown: bool,
    /// The data records in page order.
    pub records: Vec<PageRecord>,
}

fn le_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn le_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// Decodes a little-endian page of `layout.page_size` bytes.
///
/// A record that runs past the committed data is an error: the page is corrupt.
pub fn decode_page(page: &[u8], layout: &PageLayout) -> io::Result<DecodedPage> {
    let mut records = Vec::new();
    let mut out = walk_page(page, layout, |r| records.push(r))?;
    out.records = records;
    Ok(out)
}

/// Checks a page and counts its data records without allocating (the writer's check of
/// every page it is given, on the recording's drain path).
pub fn count_records(page: &[u8], layout: &PageLayout) -> io::Result<usize> {
    let mut n = 0;
    walk_page(page, layout, |_| n += 1)?;
    Ok(n)
}

/// Walks the records of a page, giving each data record to `each`; the returned page
/// has no records (the callers collect them or not).
fn walk_page(
    page: &[u8],
    layout: &PageLayout,
    mut each: impl FnMut(PageRecord),
) -> io::Result<DecodedPage> {
    if page.len() != layout.page_size {
        return Err(bad(format!(
            "page is {} bytes, expected {}",
            page.len(),
            layout.page_size
        )));
    }
    let base_ts = le_u64(page, layout.ts_offset);
    let commit = if layout.commit_size == 8 {
        le_u64(page, layout.commit_offset)
    } else {
        u64::from(le_u32(page, layout.commit_offset))
    };
    let len = (commit & COMMIT_MASK) as usize;
    let data_size = layout.data_size();
    if len > data_size {
        return Err(bad(format!(
            "page commit {len} exceeds its data size {data_size}"
        )));
    }
    let data = &page[layout.data_offset..layout.data_offset + len];
    let mut out = DecodedPage {
        base_ts,
        ..DecodedPage::default()
    };
    if commit & MISSED_EVENTS != 0 {
        let at = layout.data_offset + len;
        if commit & MISSED_STORED != 0 && at + layout.commit_size <= page.len() {
            out.missed = Some(if layout.commit_size == 8 {
                le_u64(page, at)
            } else {
                u64::from(le_u32(page, at))
            });
        } else {
            out.missed_unknown = true;
        }
    }
    let mut ts = base_ts;
    let mut off = 0usize;
    while off + 4 <= len {
        let word = le_u32(data, off);
        let type_len = word & 0x1f;
        let delta = u64::from(word >> 5);
        let rest = len - off;
        let corrupt = || {
            bad(format!(
                "page record at data offset {off} runs past the commit {len}"
            ))
        };
        match type_len {
            29 => {
                // Padding: a zero delta pads to the end of the page; otherwise a discarded
                // event whose delta still moves the clock.
                if delta == 0 {
                    break;
                }
                if rest < 8 {
                    return Err(corrupt());
                }
                let size = le_u32(data, off + 4) as usize + 4;
                if size < 8 || size > rest {
                    return Err(corrupt());
                }
                ts = ts.wrapping_add(delta);
                off += size;
            }
            30 => {
                if rest < 8 {
                    return Err(corrupt());
                }
                let high = u64::from(le_u32(data, off + 4));
                ts = ts.wrapping_add((high << 27) | delta);
                off += 8;
            }
            31 => {
                if rest < 8 {
                    return Err(corrupt());
                }
                let high = u64::from(le_u32(data, off + 4));
                let abs = (high << 27) | delta;
                // The stamp holds the low 59 bits; the page base gives the rest.
                ts = (ts & !((1u64 << 59) - 1)) | abs;
                off += 8;
            }
            0 => {
                if rest < 8 {
                    return Err(corrupt());
                }
                let body = le_u32(data, off + 4) as usize;
                let size = (body.saturating_add(4 + 3)) & !3;
                if body < 4 || size > rest {
                    return Err(corrupt());
                }
                ts = ts.wrapping_add(delta);
                each(PageRecord {
                    ts,
                    start: layout.data_offset + off + 8,
                    len: (body - 4 + 3) & !3,
                });
                off += size;
            }
            n => {
                let size = 4 + n as usize * 4;
                if size > rest {
                    return Err(corrupt());
                }
                ts = ts.wrapping_add(delta);
                each(PageRecord {
                    ts,
                    start: layout.data_offset + off + 4,
                    len: n as usize * 4,
                });
                off += size;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_64_bit_header_page() {
        let text = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\
\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\
\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n";
        assert_eq!(PageLayout::parse(text).unwrap(), PageLayout::DEFAULT);
    }

    #[test]
    fn a_record_past_the_commit_is_an_error() {
        let mut page = vec![0u8; 4096];
        page[8] = 8; // commit: 8 bytes of data
        page[16..20].copy_from_slice(&(3u32).to_le_bytes()); // type_len 3: 16 bytes
        assert!(decode_page(&page, &PageLayout::DEFAULT).is_err());
    }
}
