//! The `hist` file (histogram.rst 2, the kernel's `hist_show`): one section per hist
//! trigger of the event, each a header with the trigger's info line, one line per entry
//! sorted by the trigger's sort keys, and the totals.
//!
//! This is the read side: it copies the entries out of the map (the update path keeps
//! running), sorts them and formats them with the kernel's widths. Symbols are resolved
//! in this process, `.execname` names come from the saved comms, `.syscall` names from
//! [`super::syscalls`].

use std::cmp::Ordering;
use std::fmt::Write as _;

use ustrace_filter::hist::{flags, HistData, HistField};

use super::{Attached, Hist, STACKTRACE_DEPTH};

/// One entry copied out of the map.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The key bytes.
    pub key: Vec<u8>,
    /// Hitcount and the sums.
    pub sums: Vec<u64>,
    /// The element's variables (`None` when not set).
    pub vars: Vec<Option<u64>>,
}

fn key_u64(key: &[u8], offset: usize) -> u64 {
    let mut b = [0u8; 8];
    if let Some(s) = key.get(offset..offset + 8) {
        b.copy_from_slice(s);
    }
    u64::from_ne_bytes(b)
}

fn key_str(key: &[u8], f: &HistField) -> String {
    let slot = key.get(f.offset..f.offset + f.size).unwrap_or(&[]);
    let end = slot.iter().position(|&b| b == 0).unwrap_or(slot.len());
    String::from_utf8_lossy(&slot[..end]).into_owned()
}

/// Copies every entry of `hist`'s map.
pub fn entries(hist: &Hist) -> Vec<Entry> {
    let n_sums = hist.data.n_sums();
    let n_vars = hist.data.n_vars + hist.extra_vars;
    let mut out = Vec::with_capacity(hist.map.len());
    hist.map.for_each(|elt| {
        out.push(Entry {
            key: elt.key().to_vec(),
            sums: (0..n_sums).map(|i| elt.val(i)).collect(),
            vars: (0..n_vars).map(|i| elt.var(i)).collect(),
        })
    });
    out
}

/// Compares two keys on key field `f` as the kernel's map compares it.
fn cmp_key_field(f: &HistField, a: &[u8], b: &[u8]) -> Ordering {
    if f.has(flags::STACKTRACE) {
        return Ordering::Equal;
    }
    if f.has(flags::STRING) {
        let sa = a.get(f.offset..f.offset + f.size).unwrap_or(&[]);
        let sb = b.get(f.offset..f.offset + f.size).unwrap_or(&[]);
        let cut = |s: &[u8]| s.iter().position(|&c| c == 0).unwrap_or(s.len());
        return sa[..cut(sa)].cmp(&sb[..cut(sb)]);
    }
    let (size, signed) = match &f.field {
        Some(ef) if !f.has(flags::CPU) => (ef.size, ef.signed),
        _ => (8, f.signed),
    };
    let va = crate::event::field::read_int(a, f.offset, size.min(8), signed);
    let vb = crate::event::field::read_int(b, f.offset, size.min(8), signed);
    if signed {
        (va as i64).cmp(&(vb as i64))
    } else {
        va.cmp(&vb)
    }
}

/// Sorts entries by the trigger's sort keys; ties go by the keys in order, so the
/// output is stable between reads (the kernel leaves ties in table order).
pub fn sort(data: &HistData, entries: &mut [Entry]) {
    let n_sums = data.n_sums();
    let cmp_by = |idx: usize, a: &Entry, b: &Entry| -> Ordering {
        if idx < n_sums {
            a.sums[idx].cmp(&b.sums[idx])
        } else {
            cmp_key_field(data.sort_field(idx), &a.key, &b.key)
        }
    };
    entries.sort_by(|a, b| {
        for k in &data.sort_keys {
            let o = cmp_by(k.field_idx, a, b);
            let o = if k.descending { o.reverse() } else { o };
            if o != Ordering::Equal {
                return o;
            }
        }
        for k in data.keys() {
            let o = cmp_key_field(k, &a.key, &b.key);
            if o != Ordering::Equal {
                return o;
            }
        }
        a.key.cmp(&b.key)
    });
}

fn sym(addr: u64, offset: bool) -> String {
    let inventory = ustrace_inspect::symbols::inventory();
    if offset {
        return inventory.format_sym_off(addr as usize);
    }
    match inventory.lookup(addr as usize) {
        Some((s, _)) => {
            let full = inventory.format_sym_off(addr as usize);
            // The module (object) suffix, as `%ps` keeps it.
            match full.rfind(" [") {
                Some(at) => format!("{}{}", s.name, &full[at..]),
                None => s.name.clone(),
            }
        }
        None => format!("{addr:#x}"),
    }
}

/// The key part of an entry line, `{ ... }` (the kernel's `hist_trigger_print_key`).
pub fn print_key(data: &HistData, key: &[u8], out: &mut String) {
    out.push_str("{ ");
    let mut multiline = false;
    for (i, f) in data.keys().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let name = HistData::field_name(f);
        let v = key_u64(key, f.offset);
        if f.has(flags::HEX) {
            let _ = write!(out, "{name}: {v:x}");
        } else if f.has(flags::SYM) {
            let _ = write!(out, "{name}: [{v:x}] {:<45}", sym(v, false));
        } else if f.has(flags::SYM_OFFSET) {
            let _ = write!(out, "{name}: [{v:x}] {:<55}", sym(v, true));
        } else if f.has(flags::EXECNAME) {
            let comm = crate::thread::comm_of(v as i32).unwrap_or_else(|| "<...>".into());
            let _ = write!(out, "{name}: {comm:<16}[{v:>10}]");
        } else if f.has(flags::SYSCALL) {
            let sc = super::syscalls::name(v).unwrap_or("unknown_syscall");
            let _ = write!(out, "{name}: {sc:<30}[{v:>3}]");
        } else if f.has(flags::STACKTRACE) {
            match &f.field {
                Some(ef) => {
                    let _ = write!(out, "{}.stacktrace", ef.name);
                }
                None => out.push_str("common_stacktrace:\n"),
            }
            for j in 0..STACKTRACE_DEPTH {
                let addr = key_u64(key, f.offset + 8 * j);
                if addr == 0 {
                    break;
                }
                let _ = writeln!(out, "{:9}{}", "", sym(addr, true));
            }
            multiline = true;
        } else if f.has(flags::LOG2) {
            let _ = write!(out, "{name}: ~ 2^{v:<2}");
        } else if f.has(flags::BUCKET) {
            let _ = write!(
                out,
                "{name}: ~ {v}-{}",
                v.wrapping_add(f.buckets).wrapping_sub(1)
            );
        } else if f.has(flags::STRING) {
            let _ = write!(out, "{name}: {:<50}", key_str(key, f));
        } else {
            let _ = write!(out, "{name}: {v:>10}");
        }
    }
    if !multiline {
        out.push(' ');
    }
    out.push('}');
}

/// `val` in hundredths of a percent of `total` (the kernel's `__get_percentage`);
/// `None` for the kernel's `UINT_MAX` (a value with a zero total).
fn percentage(val: u64, total: u64) -> Option<u64> {
    if total == 0 {
        return if val != 0 { None } else { Some(0) };
    }
    if val < u64::MAX / 10000 {
        return Some(val * 10000 / total);
    }
    let total = total / 10000;
    if total == 0 {
        return if val != 0 { None } else { Some(0) };
    }
    Some(val / total)
}

fn print_val(out: &mut String, name: &str, fl: u32, val: u64, total: u64, max: u64) {
    if fl & flags::PERCENT != 0 {
        match percentage(val, total) {
            None => {
                let _ = write!(out, " {name} (%):[ERROR]");
            }
            Some(pc) => {
                let _ = write!(out, " {name} (%): {:>3}.{:02}", pc / 100, pc % 100);
            }
        }
    } else if fl & flags::GRAPH != 0 {
        let bar = match percentage(val, max) {
            None => "[ERROR]".to_string(),
            Some(len) => {
                let len = (len * 20 / 10000).min(20) as usize;
                format!("{}{}", "#".repeat(len), " ".repeat(20 - len))
            }
        };
        let _ = write!(out, " {name}: {bar:>20}");
    } else if fl & flags::HEX != 0 {
        let _ = write!(out, " {name}: {val:>10x}");
    } else {
        let _ = write!(out, " {name}: {val:>10}");
    }
}

/// One trigger's section of the `hist` file; `n` is its position among the event's hist
/// triggers (sections after the first start with two blank lines).
pub fn section(att: &Attached, n: usize) -> String {
    let hist = &att.hist;
    let data = &hist.data;
    let mut out = String::new();
    if n > 0 {
        out.push_str("\n\n");
    }
    let _ = write!(
        out,
        "# event histogram\n#\n# trigger info: {}\n#\n\n",
        att.info()
    );
    let mut entries = entries(hist);
    sort(data, &mut entries);
    let n_sums = data.n_sums();
    let mut totals = vec![0u64; n_sums];
    let mut maxes = vec![0u64; n_sums];
    for e in &entries {
        for j in 0..n_sums {
            totals[j] = totals[j].wrapping_add(e.sums[j]);
            maxes[j] = maxes[j].max(e.sums[j]);
        }
    }
    for e in &entries {
        print_key(data, &e.key, &mut out);
        if !data.attrs.no_hitcount {
            print_val(&mut out, "hitcount", 0, e.sums[0], totals[0], maxes[0]);
        }
        for (i, f) in data.vals().iter().enumerate().skip(1) {
            if f.has(flags::VAR | flags::EXPR) {
                continue;
            }
            out.push(' ');
            print_val(
                &mut out,
                &HistData::field_name(f),
                f.flags,
                e.sums[i],
                totals[i],
                maxes[i],
            );
        }
        if let Some(inter) = &hist.inter {
            inter.print_entry(e, &mut out);
        }
        out.push('\n');
    }
    if let Some(inter) = &hist.inter {
        inter.print_snapshot(&mut out, &|key, out| print_key(&hist.data, key, out));
    }
    let _ = write!(
        out,
        "\nTotals:\n    Hits: {}\n    Entries: {}\n    Dropped: {}\n",
        totals.first().copied().unwrap_or(0),
        entries.len(),
        hist.map.drops()
    );
    out
}
