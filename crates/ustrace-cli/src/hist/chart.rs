//! Terminal bar charts of a parsed `hist` section, for `ustrace hist`.
//!
//! Two pictures: a table keyed by anything gets one bar per entry in the kernel's order;
//! a table with a `.log2` or `.buckets=N` key gets the latency distribution people read
//! (one row per bucket in bucket order, ranges labelled, empty buckets between shown), one
//! distribution per value of the other keys unless merged. Labels are made compact and
//! cut to fit the width so that every bar keeps a readable length.

use super::parse::{Entry, KeyField, KeyValue, Section, Val};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What to draw and how wide.
pub struct Options<'a> {
    /// Terminal columns.
    pub width: usize,
    /// The value sizing the bars (`hitcount` when `None`).
    pub value: Option<&'a str>,
    /// One distribution over all other keys instead of one per value of them.
    pub merge: bool,
}

/// The bar of a value: eighth-cell resolution, at least a sliver for any non-zero value.
fn bar(value: u64, max: u64, cells: usize) -> String {
    const PARTS: [&str; 8] = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"];
    if max == 0 || value == 0 || cells == 0 {
        return String::new();
    }
    let eighths = (u128::from(value) * cells as u128 * 8 / u128::from(max)).max(1) as usize;
    let mut s = "█".repeat(eighths / 8);
    s.push_str(PARTS[eighths % 8]);
    s
}

/// Cuts `s` to `width` characters with an ellipsis in the middle, which keeps both the
/// start (the function, the command) and the end (the module, the pid) of most labels.
fn fit_middle(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_owned();
    }
    if width <= 1 {
        return "…".chars().take(width).collect();
    }
    let head = (width - 1) * 2 / 3;
    let tail = width - 1 - head;
    let mut out: String = s.chars().take(head).collect();
    out.push('…');
    out.extend(s.chars().skip(n - tail));
    out
}

/// Fits a compound key's parts, joined by `, `, into `width` characters: the longest part
/// gives way first, so every part keeps its start and end (`sys_inotify_…_watch, gmain-975`).
fn fit_parts(parts: &[String], width: usize) -> String {
    let joined = parts.join(", ");
    if joined.chars().count() <= width {
        return joined;
    }
    // A `.sym-offset` symbol gives up its `+off/size` before any of its name.
    let stripped: Vec<String> = parts.iter().map(|p| strip_offset(p)).collect();
    let parts = &stripped[..];
    let joined = parts.join(", ");
    if joined.chars().count() <= width || parts.len() < 2 {
        return fit_middle(&joined, width);
    }
    let seps = 2 * (parts.len() - 1);
    let Some(budget) = width.checked_sub(seps).filter(|&b| b >= 2 * parts.len()) else {
        return fit_middle(&joined, width);
    };
    let mut lens: Vec<usize> = parts.iter().map(|p| p.chars().count()).collect();
    while lens.iter().sum::<usize>() > budget {
        let (i, _) = lens
            .iter()
            .enumerate()
            .max_by_key(|&(i, l)| (*l, std::cmp::Reverse(i)))
            .unwrap_or((0, &0));
        lens[i] -= 1;
    }
    parts
        .iter()
        .zip(lens)
        .map(|(p, l)| fit_middle(p, l))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Cuts `s` to `width` characters at its end (a stack keeps its innermost frames).
fn fit_end(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    if width > 0 {
        out.push('…');
    }
    out
}

/// `func+0x1b/0x50 [mod]` → `func [mod]`: call sites of one function merge.
pub fn strip_offset(frame: &str) -> String {
    let Some(plus) = frame.find("+0x") else {
        return frame.to_owned();
    };
    let rest = &frame[plus + 1..];
    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    let looks_like_offset = rest[..end].split('/').all(|p| {
        p.strip_prefix("0x")
            .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    if !looks_like_offset {
        return frame.to_owned();
    }
    format!("{}{}", &frame[..plus], &rest[end..])
}

/// The range a `.log2` bucket holds: the kernel files `v` under `log2(roundup_pow_of_two(v))`,
/// so `2^k` holds `2^(k-1)+1 ..= 2^k`.
pub fn log2_range(k: u32) -> String {
    match k {
        0 => "0-1".to_owned(),
        1 => "2".to_owned(),
        k if k < 64 => format!("{}-{}", (1u64 << (k - 1)) + 1, 1u64 << k),
        64 => format!("{}-{}", (1u64 << 63) + 1, u64::MAX),
        k => format!("2^{k}"),
    }
}

/// One key field, compactly: a symbol without its address, `comm-pid` as in a trace line,
/// a stack as `leaf ← caller ← …`.
pub fn compact(field: &KeyField) -> String {
    match &field.value {
        KeyValue::Num(n) => n.to_string(),
        KeyValue::Hex(n) => format!("0x{n:x}"),
        KeyValue::Log2(k) => log2_range(*k),
        KeyValue::Bucket { lo, hi } => format!("{lo}-{hi}"),
        KeyValue::Sym { name, .. } => name.clone(),
        KeyValue::Execname { comm, pid } => format!("{comm}-{pid}"),
        KeyValue::Syscall { name, .. } => name.clone(),
        KeyValue::Str(s) => s.clone(),
        KeyValue::Stack(frames) => frames
            .iter()
            .map(|f| strip_offset(f))
            .collect::<Vec<_>>()
            .join(" ← "),
    }
}

fn is_stack(field: &KeyField) -> bool {
    matches!(field.value, KeyValue::Stack(_))
}

/// The names of the values the section's entries carry, in order of first appearance.
pub fn value_names(section: &Section) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for e in &section.entries {
        for v in &e.vals {
            if !names.contains(&v.name) {
                names.push(v.name.clone());
            }
        }
    }
    names
}

/// Which value sizes the bars: the one asked for, else `hitcount`, else the first.
pub fn chosen_value(section: &Section, asked: Option<&str>) -> Result<Option<String>, String> {
    let names = value_names(section);
    if names.is_empty() {
        return Ok(None);
    }
    match asked {
        Some(name) if names.iter().any(|n| n == name) => Ok(Some(name.to_owned())),
        Some(name) => Err(format!(
            "no value named `{name}` in this hist; it has: {}",
            names.join(", ")
        )),
        None if names.iter().any(|n| n == "hitcount") => Ok(Some("hitcount".to_owned())),
        None => Ok(names.into_iter().next()),
    }
}

/// The chosen value of an entry (0 when it has none, as an absent sum is).
pub fn value_of(entry: &Entry, name: &str) -> u64 {
    entry
        .vals
        .iter()
        .find(|v| v.name == name)
        .and_then(|v| v.value.number())
        .unwrap_or(0)
}

/// How a key field is declared in the trigger, for the column header (`lat.log2`).
fn key_header(section: &Section, entry: &Entry) -> String {
    if let Some(specs) = section.key_specs() {
        return specs
            .iter()
            .map(|(n, m)| match m {
                Some(m) => format!("{n}.{m}"),
                None => n.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ");
    }
    entry
        .keys
        .iter()
        .map(|k| k.name.clone())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The value column's header (`bytes_req`, `len (%)`, `len (of 20)` for a `.graph` bar's
/// cells) and how its numbers show.
fn value_header(section: &Section, name: &str) -> (String, Shown) {
    let form = section
        .entries
        .iter()
        .flat_map(|e| e.vals.iter())
        .find(|v| v.name == name)
        .map(|v| &v.value);
    match form {
        Some(Val::Percent(_)) => (format!("{name} (%)"), Shown::Percent),
        Some(Val::Graph(_)) => (format!("{name} (of 20)"), Shown::Count),
        _ => (name.to_owned(), Shown::Count),
    }
}

/// How the value column shows a number.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shown {
    Count,
    /// Hundredths of a percent (`.percent`).
    Percent,
}

fn show(v: u64, how: Shown) -> String {
    match how {
        Shown::Count => v.to_string(),
        Shown::Percent => format!("{}.{:02}%", v / 100, v % 100),
    }
}

/// A row: the label's parts (a compound key has several) and its value (`None`: a note).
type Row = (Vec<String>, Option<u64>);

/// Rows drawn against one maximum.
fn draw_rows(
    out: &mut String,
    header: (&str, &str),
    rows: &[Row],
    width: usize,
    stack_labels: bool,
    how: Shown,
) {
    let max = rows.iter().filter_map(|r| r.1).max().unwrap_or(0);
    let vw = rows
        .iter()
        .filter_map(|r| r.1.map(|v| show(v, how).chars().count()))
        .chain([header.1.chars().count()])
        .max()
        .unwrap_or(1);
    let longest = rows
        .iter()
        .map(|r| r.0.join(", ").chars().count())
        .chain([header.0.chars().count()])
        .max()
        .unwrap_or(0);
    // The label gets what is left after the value and a bar of a third of the line.
    let min_bar = (width / 3).max(10);
    let cap = width.saturating_sub(vw + 2 + min_bar).max(8);
    let lw = longest.min(cap);
    let cells = width.saturating_sub(lw + 2 + vw + 1).max(1);
    let _ = writeln!(
        out,
        "{:<lw$}  {:>vw$}",
        fit_end(header.0, lw),
        fit_middle(header.1, vw)
    );
    for (parts, value) in rows {
        let label = if stack_labels {
            fit_end(&parts.join(", "), lw)
        } else {
            fit_parts(parts, lw)
        };
        match value {
            Some(v) => {
                let shown = show(*v, how);
                let line = format!("{label:<lw$}  {shown:>vw$} {}", bar(*v, max, cells));
                let _ = writeln!(out, "{}", line.trim_end());
            }
            None => {
                let _ = writeln!(out, "{}", label.trim_end());
            }
        }
    }
}

/// The index of the distribution key: the first `.log2` or `.buckets` key.
fn distribution_key(entry: &Entry) -> Option<usize> {
    entry
        .keys
        .iter()
        .position(|k| matches!(k.value, KeyValue::Log2(_) | KeyValue::Bucket { .. }))
}

/// Draws one section (without its title).
pub fn draw(section: &Section, opts: &Options<'_>) -> Result<String, String> {
    let mut out = String::new();
    let Some(first) = section.entries.first() else {
        out.push_str("(no entries)\n");
        return Ok(out);
    };
    let Some(value) = chosen_value(section, opts.value)? else {
        out.push_str("(the entries carry no values)\n");
        return Ok(out);
    };
    let (vheader, how) = value_header(section, &value);
    match distribution_key(first) {
        Some(d) => draw_distribution(&mut out, section, d, &value, (&vheader, how), opts),
        None => {
            let rows: Vec<Row> = section
                .entries
                .iter()
                .map(|e| {
                    let parts = e.keys.iter().map(compact).collect();
                    (parts, Some(value_of(e, &value)))
                })
                .collect();
            let stack_labels = first.keys.iter().any(is_stack);
            let kh = key_header(section, first);
            draw_rows(
                &mut out,
                (&kh, &vheader),
                &rows,
                opts.width,
                stack_labels,
                how,
            );
        }
    }
    Ok(out)
}

/// Bucket position for ordering: the exponent, or the bucket's first value.
fn bucket_of(field: &KeyField) -> Option<(u64, u64)> {
    match field.value {
        KeyValue::Log2(k) => Some((u64::from(k), 1)),
        KeyValue::Bucket { lo, hi } => Some((lo, hi.saturating_sub(lo).saturating_add(1))),
        _ => None,
    }
}

fn bucket_label(log2: bool, pos: u64, step: u64) -> String {
    if log2 {
        log2_range(pos.min(u64::from(u32::MAX)) as u32)
    } else {
        format!("{pos}-{}", pos.saturating_add(step - 1))
    }
}

/// Runs of more empty buckets than this are drawn as one `⋮` row.
const MAX_EMPTY_RUN: u64 = 8;

fn draw_distribution(
    out: &mut String,
    section: &Section,
    d: usize,
    value: &str,
    (vheader, how): (&str, Shown),
    opts: &Options<'_>,
) {
    let log2 = matches!(section.entries[0].keys[d].value, KeyValue::Log2(_));
    let mut step = 1u64;
    // Group by the other keys, in order of first appearance.
    let mut order: Vec<String> = Vec::new();
    let mut groups: BTreeMap<String, BTreeMap<u64, u64>> = BTreeMap::new();
    for e in &section.entries {
        let Some((pos, s)) = e.keys.get(d).and_then(bucket_of) else {
            continue;
        };
        step = step.max(s);
        let group = if opts.merge {
            String::new()
        } else {
            e.keys
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != d)
                .map(|(_, k)| format!("{}: {}", k.name, compact(k)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !groups.contains_key(&group) {
            order.push(group.clone());
        }
        let slot = groups.entry(group).or_default().entry(pos).or_insert(0);
        *slot = slot.saturating_add(value_of(e, value));
    }
    let dist_key = &section.entries[0].keys[d];
    let spec = section
        .key_specs()
        .and_then(|s| s.into_iter().find(|(n, _)| *n == dist_key.name))
        .map(|(n, m)| m.map_or(n.clone(), |m| format!("{n}.{m}")))
        .unwrap_or_else(|| dist_key.name.clone());
    let stride = if log2 { 1 } else { step };
    for (n, group) in order.iter().enumerate() {
        let buckets = &groups[group];
        if n > 0 {
            out.push('\n');
        }
        let total: u64 = buckets.values().fold(0u64, |a, b| a.saturating_add(*b));
        if !group.is_empty() {
            let line = format!("{group}  ({value} total {total})");
            let _ = writeln!(out, "{}", fit_end(&line, opts.width));
        }
        let (Some(&lo), Some(&hi)) = (buckets.keys().next(), buckets.keys().next_back()) else {
            continue;
        };
        let mut rows: Vec<Row> = Vec::new();
        let mut pos = lo;
        loop {
            match buckets.get(&pos) {
                Some(&v) => rows.push((vec![bucket_label(log2, pos, step)], Some(v))),
                None => {
                    // How many empty buckets follow, up to the next full one.
                    let next = buckets.range(pos..).next().map_or(hi, |(&p, _)| p);
                    let empties = (next - pos) / stride;
                    if empties > MAX_EMPTY_RUN {
                        rows.push((vec![format!("⋮ ({empties} empty buckets)")], None));
                        pos = next;
                        continue;
                    }
                    rows.push((vec![bucket_label(log2, pos, step)], Some(0)));
                }
            }
            match pos.checked_add(stride) {
                Some(p) if p <= hi => pos = p,
                _ => break,
            }
        }
        draw_rows(out, (&spec, vheader), &rows, opts.width, false, how);
    }
}
