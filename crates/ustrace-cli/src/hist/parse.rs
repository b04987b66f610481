//! The kernel's `hist` file read back into sections and entries, and printed again.
//!
//! `ustrace hist` reads an event's `hist` file (from a process's tracefs, the kernel's, or a
//! saved copy) and draws it; this module is the reading half. The layout is the one
//! histogram.rst shows and `kernel/trace/trace_events_hist.c` prints: per trigger a section
//! `# event histogram` / `# trigger info: …`, one `{ key: value, … } hitcount: N  val: M` line
//! per entry (a stacktrace key spreads over indented lines up to a line starting with `}`),
//! and a `Totals:` block. Older kernels (and most of the document's examples) start a section
//! at `# trigger info:` alone; both are read.
//!
//! Reading is tolerant: lines it does not understand are kept (`Section::other`,
//! `Entry::extra` for the `max:`/saved-value lines of `onmax()`/`onchange()`), several sections
//! are read, and a value it cannot interpret is kept as text. Only text that cannot be a hist
//! at all, an entry never closed, a key that is not `name: value`, or a `Totals:` count that is
//! not a number is an error, with its line number.
//!
//! [`HistFile`]'s `Display` prints the kernel's layout again, byte for byte for what the
//! kernel prints (the property tests check that parse ∘ print is the identity).
//!
//! This file is self-contained (std only) so the fuzz target and the tests can include it.

use std::collections::HashMap;
use std::fmt;

/// A whole `hist` file: one section per hist trigger of the event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HistFile {
    /// In file order.
    pub sections: Vec<Section>,
}

/// One hist trigger's table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Section {
    /// The text after `# trigger info: `, e.g. `hist:keys=pid:vals=hitcount:… [active]`.
    pub trigger: Option<String>,
    /// In the order the kernel sorted them.
    pub entries: Vec<Entry>,
    /// The `Totals:` block, when there was one.
    pub totals: Option<Totals>,
    /// Lines not understood (a snapshot's details, a document's `.` elisions), kept verbatim.
    pub other: Vec<String>,
}

/// One `{ key } values` entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Entry {
    /// The key's fields, in order (a compound key has several).
    pub keys: Vec<KeyField>,
    /// `hitcount` first as the kernel prints it, then the trigger's values.
    pub vals: Vec<ValField>,
    /// Indented lines printed after the entry by `onmax()`/`onchange()` (`max:`, saved fields).
    pub extra: Vec<String>,
    /// Text after the values that is not `name: value`, kept verbatim.
    pub trailing: Option<String>,
}

/// One field of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyField {
    /// As printed: `call_site`, `common_stacktrace`, or `stack.stacktrace` for a stack field.
    pub name: String,
    /// The value, interpreted by the field's modifier.
    pub value: KeyValue,
}

/// A key field's value in each form the kernel prints one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyValue {
    /// A plain number.
    Num(u64),
    /// `.hex`.
    Hex(u64),
    /// `.log2`: the exponent of `~ 2^N`.
    Log2(u32),
    /// `.buckets=N`: the bucket `~ lo-hi`, both ends included.
    Bucket {
        /// First value of the bucket.
        lo: u64,
        /// Last value of the bucket.
        hi: u64,
    },
    /// `.sym` / `.sym-offset`: `[address] symbol`.
    Sym {
        /// The address.
        addr: u64,
        /// The symbol as printed (with `+off/size [module]` for `.sym-offset`).
        name: String,
        /// `.sym-offset` (printed in a wider column).
        offset: bool,
    },
    /// `.execname`: `comm [pid]`.
    Execname {
        /// The saved command name.
        comm: String,
        /// The pid.
        pid: u64,
    },
    /// `.syscall`: `name [nr]`.
    Syscall {
        /// The syscall's name (`unknown_syscall` when it has none).
        name: String,
        /// Its number.
        nr: u64,
    },
    /// A string field.
    Str(String),
    /// A stacktrace, innermost frame first, as printed (`func+0x1b/0x50 [mod]`).
    Stack(Vec<String>),
}

/// One value printed after the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValField {
    /// `hitcount` or the value's field name (without ` (%)`).
    pub name: String,
    /// The value.
    pub value: Val,
}

/// A value in each form the kernel prints one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Val {
    /// A sum.
    Num(u64),
    /// `.hex`.
    Hex(u64),
    /// `.percent`, in hundredths of a percent.
    Percent(u32),
    /// `.graph`: how many of the 20 bar cells are filled.
    Graph(u32),
    /// `.percent` of a zero total (`[ERROR]`).
    Error,
    /// Anything else, verbatim.
    Text(String),
}

impl Val {
    /// The value as a number to chart, when it has one.
    pub fn number(&self) -> Option<u64> {
        match *self {
            Val::Num(n) | Val::Hex(n) => Some(n),
            Val::Percent(p) => Some(u64::from(p)),
            Val::Graph(g) => Some(u64::from(g)),
            Val::Error | Val::Text(_) => None,
        }
    }
}

/// The `Totals:` block.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Totals {
    /// `Hits:` — events that reached the trigger.
    pub hits: Option<u64>,
    /// `Entries:` — distinct keys in the table.
    pub entries: Option<u64>,
    /// `Dropped:` — events lost because the table was full.
    pub dropped: Option<u64>,
    /// Other `Name: value` lines of the block, verbatim.
    pub other: Vec<(String, String)>,
}

/// Why a text could not be read as a hist file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What was expected.
    pub message: String,
    /// The offending line.
    pub text: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text: String = self.text.chars().take(120).collect();
        if text.len() < self.text.len() {
            text.push('…');
        }
        write!(f, "line {}: {}\n  {}", self.line, self.message, text)
    }
}

impl std::error::Error for ParseError {}

/// How a key or value was declared in the trigger (`call_site.sym` → `sym`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hint<'a> {
    /// No trigger info: guess from the text's shape.
    Unknown,
    /// Declared, with this modifier or none.
    Known(Option<&'a str>),
}

/// The `keys=`/`vals=` items of a trigger info line: `(name, modifier)` in order.
/// `lat.buckets=10` gives `("lat", Some("buckets=10"))`.
pub fn trigger_list(trigger: &str, which: &[&str]) -> Option<Vec<(String, Option<String>)>> {
    // The filter and the state come after the last `:`-separated part, after a space.
    let spec = trigger.split(' ').next().unwrap_or("");
    for part in spec.split(':') {
        for prefix in which {
            if let Some(list) = part.strip_prefix(prefix) {
                return Some(
                    list.split(',')
                        .filter(|s| !s.is_empty())
                        .map(|item| match item.split_once('.') {
                            Some((name, m)) => (name.to_owned(), Some(m.to_owned())),
                            None => (item.to_owned(), None),
                        })
                        .collect(),
                );
            }
        }
    }
    None
}

impl Section {
    /// The trigger's keys as `(name, modifier)`, when the section has trigger info.
    pub fn key_specs(&self) -> Option<Vec<(String, Option<String>)>> {
        trigger_list(self.trigger.as_deref()?, &["keys=", "key="])
    }

    /// The trigger's values as `(name, modifier)`, when the section has trigger info.
    pub fn val_specs(&self) -> Option<Vec<(String, Option<String>)>> {
        trigger_list(
            self.trigger.as_deref()?,
            &["vals=", "values=", "val=", "value="],
        )
    }

    fn is_empty(&self) -> bool {
        self.trigger.is_none()
            && self.entries.is_empty()
            && self.totals.is_none()
            && self.other.is_empty()
    }
}

/// The modifiers of a section's declared keys or values, by name.
struct Hints {
    map: Option<HashMap<String, Option<String>>>,
}

impl Hints {
    fn new(list: Option<Vec<(String, Option<String>)>>) -> Hints {
        Hints {
            map: list.map(|l| l.into_iter().collect()),
        }
    }

    fn get(&self, name: &str) -> Hint<'_> {
        let Some(map) = &self.map else {
            return Hint::Unknown;
        };
        let base = name.strip_suffix(".stacktrace").unwrap_or(name);
        match map.get(base) {
            Some(m) => Hint::Known(m.as_deref()),
            // A name the trigger does not declare (a variable, a renamed field): guess.
            None => Hint::Unknown,
        }
    }

    fn knows(&self, name: &str) -> bool {
        match &self.map {
            None => true,
            Some(map) => map.contains_key(name.strip_suffix(".stacktrace").unwrap_or(name)),
        }
    }
}

fn err(line: usize, message: impl Into<String>, text: &str) -> ParseError {
    ParseError {
        line: line + 1,
        message: message.into(),
        text: text.to_owned(),
    }
}

/// Reads a `hist` file. Empty text (an event without hist triggers) gives no sections.
pub fn parse(text: &str) -> Result<HistFile, ParseError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut file = HistFile::default();
    let mut cur = Section::default();
    let mut key_hints = Hints::new(None);
    let mut val_hints = Hints::new(None);
    let mut in_totals = false;
    let mut after_entry = false;
    let mut first_unknown: Option<usize> = None;
    let mut recognised = false;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let t = line.trim();
        if t.is_empty() {
            i += 1;
            continue;
        }
        if t == "# event histogram" {
            recognised = true;
            if !cur.is_empty() {
                file.sections.push(std::mem::take(&mut cur));
            }
            key_hints = Hints::new(None);
            val_hints = Hints::new(None);
            in_totals = false;
            after_entry = false;
            i += 1;
            continue;
        }
        if let Some(info) = t.strip_prefix("# trigger info:") {
            recognised = true;
            // A section of the older layout starts at its trigger info.
            if cur.trigger.is_some() || !cur.entries.is_empty() || cur.totals.is_some() {
                file.sections.push(std::mem::take(&mut cur));
            }
            cur.trigger = Some(info.trim().to_owned());
            key_hints = Hints::new(cur.key_specs());
            val_hints = Hints::new(cur.val_specs());
            in_totals = false;
            after_entry = false;
            i += 1;
            continue;
        }
        if t.starts_with('#') {
            i += 1;
            continue;
        }
        if t.starts_with('{') {
            recognised = true;
            let (entry, next) = parse_entry(&lines, i, &key_hints, &val_hints)?;
            cur.entries.push(entry);
            i = next;
            in_totals = false;
            after_entry = true;
            continue;
        }
        if t == "Totals:" {
            recognised = true;
            cur.totals = Some(Totals::default());
            in_totals = true;
            after_entry = false;
            i += 1;
            continue;
        }
        if in_totals {
            if let (Some(totals), Some((name, value))) = (cur.totals.as_mut(), t.split_once(':')) {
                let (name, value) = (name.trim(), value.trim());
                let slot = match name {
                    "Hits" => Some(&mut totals.hits),
                    "Entries" => Some(&mut totals.entries),
                    "Dropped" => Some(&mut totals.dropped),
                    _ => None,
                };
                match slot {
                    Some(slot) => {
                        *slot = Some(value.parse().map_err(|_| {
                            err(i, format!("`{name}:` takes a count, not `{value}`"), line)
                        })?)
                    }
                    None => totals.other.push((name.to_owned(), value.to_owned())),
                }
                i += 1;
                continue;
            }
            in_totals = false;
        }
        if after_entry && line.starts_with(char::is_whitespace) {
            if let Some(entry) = cur.entries.last_mut() {
                entry.extra.push(line.to_owned());
                i += 1;
                continue;
            }
        }
        after_entry = false;
        first_unknown.get_or_insert(i);
        cur.other.push(line.to_owned());
        i += 1;
    }
    if !cur.is_empty() {
        file.sections.push(cur);
    }
    if let (false, Some(at)) = (recognised, first_unknown) {
        return Err(err(
            at,
            "not a hist file: expected `# event histogram`, `# trigger info: …`, \
             `{ key: value } hitcount: N` or `Totals:`",
            lines[at],
        ));
    }
    Ok(file)
}

/// Reads the entry starting at line `start`; returns it and the index of the next line.
fn parse_entry(
    lines: &[&str],
    start: usize,
    key_hints: &Hints,
    val_hints: &Hints,
) -> Result<(Entry, usize), ParseError> {
    let first = lines[start];
    let open = first.find('{').unwrap_or(0);
    let (key_text, rest, next) = match first.rfind('}') {
        Some(close) if close > open => (
            first[open + 1..close].to_owned(),
            &first[close + 1..],
            start + 1,
        ),
        _ => {
            // A stacktrace key: frames on the following lines, up to the line that starts
            // with the `}` (or with the `, name: value` fields that follow the stack).
            let mut key = first[open + 1..].to_owned();
            let mut j = start + 1;
            loop {
                let Some(line) = lines.get(j) else {
                    return Err(err(
                        start,
                        "this entry's `{` is never closed by a `}`",
                        first,
                    ));
                };
                key.push('\n');
                let t = line.trim_start();
                if let (true, Some(close)) =
                    (t.starts_with('}') || t.starts_with(','), line.rfind('}'))
                {
                    key.push_str(&line[..close]);
                    break (key, &line[close + 1..], j + 1);
                }
                key.push_str(line);
                j += 1;
            }
        }
    };
    let keys = parse_keys(&key_text, key_hints).map_err(|m| err(start, m, first))?;
    let (vals, leftover) = parse_vals(rest, val_hints);
    Ok((
        Entry {
            keys,
            vals,
            extra: Vec::new(),
            trailing: leftover,
        },
        next,
    ))
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'$' | b'-')
}

/// If a key field starts at `s`, its printed name and where its value starts.
fn field_head(s: &str) -> Option<(&str, usize)> {
    let b = s.as_bytes();
    if b.is_empty() || !(b[0].is_ascii_alphabetic() || b[0] == b'_' || b[0] == b'$') {
        return None;
    }
    let end = b.iter().position(|&c| !is_name_byte(c)).unwrap_or(b.len());
    let name = &s[..end];
    if b.get(end) == Some(&b':') {
        return Some((name, end + 1));
    }
    // `FIELD.stacktrace` is printed without a colon, its first frame on the same line.
    if name.ends_with(".stacktrace") {
        return Some((name, end));
    }
    None
}

/// Splits `{ … }`'s inside into fields at `, NAME:` and reads each.
fn parse_keys(text: &str, hints: &Hints) -> Result<Vec<KeyField>, String> {
    let body = text.strip_prefix(' ').unwrap_or(text);
    if body.trim().is_empty() {
        return Ok(Vec::new());
    }
    let lead = body.len() - body.trim_start().len();
    let body = &body[lead..];
    let Some((first_name, first_at)) = field_head(body) else {
        return Err(format!(
            "the key `{}` is not `name: value`",
            body.lines().next().unwrap_or("").trim()
        ));
    };
    let mut heads = vec![(0usize, first_name, first_at)];
    let mut from = first_at;
    while let Some(pos) = body[from..].find(", ") {
        let at = from + pos + 2;
        match field_head(&body[at..]) {
            Some((name, vstart)) if hints.knows(name) => {
                heads.push((at, name, at + vstart));
                from = at + vstart;
            }
            _ => from = at,
        }
    }
    let mut out = Vec::with_capacity(heads.len());
    for (n, &(_, name, vstart)) in heads.iter().enumerate() {
        let vend = heads.get(n + 1).map_or(body.len(), |h| h.0 - 2);
        let raw = &body[vstart..vend];
        // `name: value`: the one space after the colon is layout, not value.
        let raw = if raw.starts_with(" \n") || raw.starts_with('\n') {
            raw
        } else {
            raw.strip_prefix(' ').unwrap_or(raw)
        };
        out.push(KeyField {
            name: name.to_owned(),
            value: key_value(name, raw, hints.get(name)),
        });
    }
    Ok(out)
}

fn is_stack_name(name: &str) -> bool {
    name == "common_stacktrace" || name == "stacktrace" || name.ends_with(".stacktrace")
}

fn frames(raw: &str) -> Vec<String> {
    raw.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn parse_log2(t: &str) -> Option<u32> {
    t.strip_prefix("~ 2^")?.trim().parse().ok()
}

fn parse_bucket(t: &str) -> Option<(u64, u64)> {
    let (lo, hi) = t.strip_prefix("~ ")?.trim().split_once('-')?;
    Some((lo.parse().ok()?, hi.parse().ok()?))
}

fn parse_sym(t: &str) -> Option<(u64, String)> {
    let (addr, name) = t.strip_prefix('[')?.split_once(']')?;
    let addr = u64::from_str_radix(addr, 16).ok()?;
    Some((addr, name.trim().to_owned()))
}

/// `comm [   pid]`: the label, the number, and the bracket's inside width.
fn parse_labeled(t: &str) -> Option<(String, u64, usize)> {
    let t = t.trim_end().strip_suffix(']')?;
    let open = t.rfind('[')?;
    let inner = &t[open + 1..];
    let n = inner.trim_start().parse().ok()?;
    Some((t[..open].trim_end().to_owned(), n, inner.len()))
}

fn key_value(name: &str, raw: &str, hint: Hint<'_>) -> KeyValue {
    let t = raw.trim();
    // Only a stack spreads over lines.
    if is_stack_name(name) || hint == Hint::Known(Some("stacktrace")) || raw.contains('\n') {
        return KeyValue::Stack(frames(raw));
    }
    if let Hint::Known(m) = hint {
        let typed = match m {
            Some("hex") => u64::from_str_radix(t, 16).ok().map(KeyValue::Hex),
            Some("log2") => parse_log2(t).map(KeyValue::Log2),
            Some(b) if b.starts_with("buckets") => {
                parse_bucket(t).map(|(lo, hi)| KeyValue::Bucket { lo, hi })
            }
            Some(s @ ("sym" | "sym-offset")) => parse_sym(t).map(|(addr, name)| KeyValue::Sym {
                addr,
                name,
                offset: s == "sym-offset",
            }),
            Some("execname") => {
                parse_labeled(t).map(|(comm, pid, _)| KeyValue::Execname { comm, pid })
            }
            Some("syscall") => parse_labeled(t).map(|(name, nr, _)| KeyValue::Syscall { name, nr }),
            _ => Some(match t.parse() {
                Ok(n) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => KeyValue::Num(n),
                _ => KeyValue::Str(raw.trim_end().to_owned()),
            }),
        };
        if let Some(v) = typed {
            return v;
        }
    }
    // No trigger info, or a value not of its declared form: read it by its shape.
    if let Some(k) = parse_log2(t) {
        return KeyValue::Log2(k);
    }
    if let Some((lo, hi)) = parse_bucket(t) {
        return KeyValue::Bucket { lo, hi };
    }
    if let Some((addr, name)) = parse_sym(t) {
        let offset = name.contains("+0x");
        return KeyValue::Sym { addr, name, offset };
    }
    if let Some((label, n, width)) = parse_labeled(t) {
        return if width >= 10 {
            KeyValue::Execname {
                comm: label,
                pid: n,
            }
        } else {
            KeyValue::Syscall { name: label, nr: n }
        };
    }
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = t.parse() {
            return KeyValue::Num(n);
        }
    }
    KeyValue::Str(raw.trim_end().to_owned())
}

/// Reads ` hitcount:          1  bytes_req:        176 …`.
/// Returns the values and any text after them that is not `name: value`.
fn parse_vals(rest: &str, hints: &Hints) -> (Vec<ValField>, Option<String>) {
    let mut out = Vec::new();
    let mut s = rest;
    loop {
        s = s.trim_start();
        if s.is_empty() {
            return (out, None);
        }
        // Text that is not `name: value` (a document's line continuation) is kept whole.
        let Some(colon) = s.find(':').filter(|&c| !s[..c].trim().is_empty()) else {
            return (out, Some(s.trim_end().to_owned()));
        };
        let label = s[..colon].trim();
        let after = &s[colon + 1..];
        // `.graph`: a 20-cell bar of `#` and spaces, the only value with inner spaces.
        if let Some(bar) = after.strip_prefix(' ') {
            // A `%10llu` number has a digit in its first ten columns; a bar of an entry
            // far below the maximum is all spaces.
            if bar.len() >= 20 && bar.as_bytes()[..20].iter().all(|&b| b == b'#' || b == b' ') {
                let filled = bar.as_bytes()[..20].iter().filter(|&&b| b == b'#').count();
                out.push(ValField {
                    name: label.to_owned(),
                    value: Val::Graph(filled as u32),
                });
                s = &bar[20..];
                continue;
            }
        }
        let v = after.trim_start();
        let end = v.find(char::is_whitespace).unwrap_or(v.len());
        let token = &v[..end];
        s = &v[end..];
        let (name, value) = if let Some(name) = label.strip_suffix(" (%)") {
            (name, percent(token))
        } else {
            (label, number(token, hints.get(label)))
        };
        out.push(ValField {
            name: name.to_owned(),
            value,
        });
    }
}

fn percent(token: &str) -> Val {
    if token == "[ERROR]" {
        return Val::Error;
    }
    let parsed = token.split_once('.').and_then(|(int, frac)| {
        if frac.len() != 2 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let int: u32 = int.parse().ok()?;
        int.checked_mul(100)?.checked_add(frac.parse().ok()?)
    });
    parsed.map_or_else(|| Val::Text(token.to_owned()), Val::Percent)
}

fn number(token: &str, hint: Hint<'_>) -> Val {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    let hexy = !token.is_empty() && token.bytes().all(|b| b.is_ascii_hexdigit());
    let hex = match hint {
        Hint::Known(m) => m == Some("hex"),
        // Unknown: only letters tell hex apart.
        Hint::Unknown => hexy && !digits,
    };
    if hex && hexy {
        if let Ok(n) = u64::from_str_radix(token, 16) {
            return Val::Hex(n);
        }
    }
    if digits {
        if let Ok(n) = token.parse() {
            return Val::Num(n);
        }
    }
    Val::Text(token.to_owned())
}

impl fmt::Display for KeyField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = &self.name;
        match &self.value {
            KeyValue::Num(n) => write!(f, "{name}: {n:>10}"),
            KeyValue::Hex(n) => write!(f, "{name}: {n:x}"),
            KeyValue::Log2(k) => write!(f, "{name}: ~ 2^{k:<2}"),
            KeyValue::Bucket { lo, hi } => write!(f, "{name}: ~ {lo}-{hi}"),
            KeyValue::Sym {
                addr,
                name: sym,
                offset: false,
            } => write!(f, "{name}: [{addr:x}] {sym:<45}"),
            KeyValue::Sym {
                addr,
                name: sym,
                offset: true,
            } => write!(f, "{name}: [{addr:x}] {sym:<55}"),
            KeyValue::Execname { comm, pid } => write!(f, "{name}: {comm:<16}[{pid:>10}]"),
            KeyValue::Syscall { name: sc, nr } => write!(f, "{name}: {sc:<30}[{nr:>3}]"),
            KeyValue::Str(s) => write!(f, "{name}: {s:<50}"),
            KeyValue::Stack(frames) => {
                if name.ends_with(".stacktrace") {
                    write!(f, "{name}")?;
                } else {
                    writeln!(f, "{name}:")?;
                }
                for frame in frames {
                    writeln!(f, "         {frame}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{ ")?;
        for (i, k) in self.keys.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}")?;
        }
        let multiline = self
            .keys
            .iter()
            .any(|k| matches!(k.value, KeyValue::Stack(_)));
        f.write_str(if multiline { "}" } else { " }" })?;
        for (i, v) in self.vals.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            let name = &v.name;
            match &v.value {
                Val::Num(n) => write!(f, " {name}: {n:>10}")?,
                Val::Hex(n) => write!(f, " {name}: {n:>10x}")?,
                Val::Percent(p) => write!(f, " {name} (%): {:>3}.{:02}", p / 100, p % 100)?,
                Val::Error => write!(f, " {name} (%):[ERROR]")?,
                Val::Graph(g) => {
                    let g = (*g).min(20) as usize;
                    write!(f, " {name}: {}{}", "#".repeat(g), " ".repeat(20 - g))?
                }
                Val::Text(t) => write!(f, " {name}: {t}")?,
            }
        }
        if let Some(t) = &self.trailing {
            write!(f, " {t}")?;
        }
        for line in &self.extra {
            write!(f, "\n{line}")?;
        }
        Ok(())
    }
}

impl fmt::Display for HistFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, s) in self.sections.iter().enumerate() {
            if n > 0 {
                f.write_str("\n\n")?;
            }
            f.write_str("# event histogram\n#\n")?;
            if let Some(t) = &s.trigger {
                writeln!(f, "# trigger info: {t}")?;
            }
            f.write_str("#\n\n")?;
            for e in &s.entries {
                writeln!(f, "{e}")?;
            }
            for line in &s.other {
                writeln!(f, "{line}")?;
            }
            if let Some(t) = &s.totals {
                f.write_str("\nTotals:\n")?;
                for (name, v) in [
                    ("Hits", t.hits),
                    ("Entries", t.entries),
                    ("Dropped", t.dropped),
                ] {
                    if let Some(v) = v {
                        writeln!(f, "    {name}: {v}")?;
                    }
                }
                for (name, v) in &t.other {
                    writeln!(f, "    {name}: {v}")?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_kernel_section_round_trips() {
        let text = "# event histogram\n#\n# trigger info: hist:keys=call_site.sym,lat.log2:vals=hitcount,bytes_req.percent:sort=hitcount:size=2048 [active]\n#\n\n\
{ call_site: [ffffffff810adcb9] syslog_print_all                             , lat: ~ 2^5  } hitcount:          1  bytes_req (%):  12.50\n\
\nTotals:\n    Hits: 1\n    Entries: 1\n    Dropped: 0\n";
        let parsed = parse(text).unwrap();
        assert_eq!(parsed.to_string(), text);
        let e = &parsed.sections[0].entries[0];
        assert_eq!(e.keys[1].value, KeyValue::Log2(5));
        assert_eq!(e.vals[1].value, Val::Percent(1250));
    }

    #[test]
    fn garbage_is_refused_with_its_line() {
        let e = parse("\nhello world\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("not a hist file"), "{e}");
        let e = parse("{ common_stacktrace:\n         f+0x1/0x2\n").unwrap_err();
        assert!(e.message.contains("never closed"), "{e}");
        let e = parse("Totals:\n    Hits: many\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("`Hits:` takes a count"), "{e}");
        assert_eq!(parse("").unwrap(), HistFile::default());
    }
}
