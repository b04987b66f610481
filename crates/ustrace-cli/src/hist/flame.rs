//! Flame graphs from a stacktrace-keyed hist: the folded-stack text that flamegraph.pl and
//! inferno read, and a self-contained SVG drawn here (no dependency, no script).
//!
//! Each entry's stack (printed innermost first by the kernel) becomes one folded line
//! `root;…;leaf weight`, weighted by hitcount or the chosen value; the entry's other key
//! fields become the frames nearest the root, so a `delta.buckets=100,stack.stacktrace`
//! hist splits by latency bucket first.

use super::chart::{compact, strip_offset, value_of};
use super::parse::{KeyValue, Section};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Whether the section's entries are keyed by a stack.
pub fn has_stack(section: &Section) -> bool {
    section
        .entries
        .iter()
        .any(|e| e.keys.iter().any(|k| matches!(k.value, KeyValue::Stack(_))))
}

/// `;` separates frames in the folded format; one inside a name would split it.
fn frame_name(s: &str) -> String {
    s.replace(';', ":")
}

/// The folded stacks of a section, merged and sorted: `(frames root first, weight)`.
pub fn folded(section: &Section, value: &str) -> Vec<(String, u64)> {
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for e in &section.entries {
        let mut frames: Vec<String> = Vec::new();
        for k in &e.keys {
            if !matches!(k.value, KeyValue::Stack(_)) {
                frames.push(frame_name(&format!("{}: {}", k.name, compact(k))));
            }
        }
        for k in &e.keys {
            if let KeyValue::Stack(stack) = &k.value {
                frames.extend(stack.iter().rev().map(|f| frame_name(&strip_offset(f))));
            }
        }
        if frames.is_empty() {
            continue;
        }
        let w = value_of(e, value);
        if w == 0 {
            continue;
        }
        let slot = merged.entry(frames.join(";")).or_insert(0);
        *slot = slot.saturating_add(w);
    }
    merged.into_iter().collect()
}

/// The folded text, one `stack weight` a line.
pub fn folded_text(stacks: &[(String, u64)]) -> String {
    let mut out = String::new();
    for (s, w) in stacks {
        let _ = writeln!(out, "{s} {w}");
    }
    out
}

#[derive(Default)]
struct Node {
    total: u64,
    children: BTreeMap<String, Node>,
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c if (c as u32) < 0x20 && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// FNV-1a: a colour that stays the same for a name from one graph to the next.
fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

const WIDTH: f64 = 1200.0;
const PAD: f64 = 10.0;
const ROW: f64 = 16.0;
const TOP: f64 = 40.0;
/// Frames narrower than this many pixels are left out, as flamegraph.pl does.
const MIN_PX: f64 = 0.1;
/// Average glyph width of the 12px font, to fit labels.
const GLYPH: f64 = 7.0;

/// A flame graph of the folded stacks, root at the bottom, widths proportional to weight.
pub fn svg(stacks: &[(String, u64)], title: &str, unit: &str) -> String {
    let mut root = Node::default();
    let mut depth = 0usize;
    for (s, w) in stacks {
        root.total = root.total.saturating_add(*w);
        let mut node = &mut root;
        let mut d = 0;
        for frame in s.split(';') {
            node = node.children.entry(frame.to_owned()).or_default();
            node.total = node.total.saturating_add(*w);
            d += 1;
        }
        depth = depth.max(d);
    }
    let height = TOP + (depth as f64 + 1.0) * ROW + PAD * 2.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" \
         xmlns=\"http://www.w3.org/2000/svg\">\n\
         <style>text {{ font-family: Verdana, sans-serif; font-size: 12px; fill: #000; }} \
         .title {{ font-size: 17px; }}</style>\n\
         <rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{height}\" fill=\"#f8f8f0\"/>\n\
         <text class=\"title\" x=\"{}\" y=\"24\" text-anchor=\"middle\">{}</text>",
        WIDTH / 2.0,
        xml_escape(title)
    );
    let scale = if root.total == 0 {
        0.0
    } else {
        (WIDTH - 2.0 * PAD) / root.total as f64
    };
    let base = height - PAD;
    frame(
        &mut out, "all", &root, root.total, PAD, 0, base, scale, unit,
    );
    out.push_str("</svg>\n");
    out
}

#[allow(clippy::too_many_arguments)]
fn frame(
    out: &mut String,
    name: &str,
    node: &Node,
    all: u64,
    x: f64,
    depth: usize,
    base: f64,
    scale: f64,
    unit: &str,
) {
    let w = node.total as f64 * scale;
    if w < MIN_PX {
        return;
    }
    let y = base - (depth as f64 + 1.0) * ROW;
    let h = hash(name);
    let (r, g, b) = if depth == 0 {
        (200, 200, 200)
    } else {
        (205 + h % 50, (h >> 8) % 230, (h >> 16) % 55)
    };
    let pct = if all == 0 {
        0.0
    } else {
        node.total as f64 * 100.0 / all as f64
    };
    let label = xml_escape(name);
    let _ = writeln!(
        out,
        "<g><title>{label} ({} {unit}, {pct:.2}%)</title>\
         <rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"rgb({r},{g},{b})\" rx=\"2\"/>",
        node.total,
        ROW - 1.0
    );
    let fits = ((w - 6.0) / GLYPH).floor();
    if fits >= 3.0 {
        let fits = fits as usize;
        let shown: String = if name.chars().count() <= fits {
            name.to_owned()
        } else {
            let mut s: String = name.chars().take(fits - 2).collect();
            s.push_str("..");
            s
        };
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            x + 3.0,
            y + ROW - 4.5,
            xml_escape(&shown)
        );
    }
    out.push_str("</g>\n");
    let mut cx = x;
    for (child_name, child) in &node.children {
        frame(
            out,
            child_name,
            child,
            all,
            cx,
            depth + 1,
            base,
            scale,
            unit,
        );
        cx += child.total as f64 * scale;
    }
}
