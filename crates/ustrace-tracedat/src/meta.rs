//! [`TraceMeta`]: everything a trace.dat holds besides the pages, read from a tracefs.
//!
//! A recorder takes it once at the start (the formats of the events it records, the page
//! layout, the clock), and again at the end for what grows while tracing (saved_cmdlines,
//! saved_tgids). The tracefs may be the process's own (`ustrace::tracefs()`), one reached
//! over the control socket, or the kernel's: only the file reader differs.

use std::collections::HashMap;
use std::io;

use crate::format::EventFormat;
use crate::page::PageLayout;

/// The ftrace events trace-cmd stores formats of, besides any listed in `available_events`.
const FTRACE_EVENTS: &[&str] = &[
    "function",
    "funcgraph_entry",
    "funcgraph_exit",
    "print",
    "bprint",
    "bputs",
    "raw_data",
    "kernel_stack",
    "user_stack",
    "func_repeats",
];

/// Everything a trace.dat holds besides the ring-buffer pages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceMeta {
    /// `events/header_page`.
    pub header_page: Vec<u8>,
    /// `events/header_event`.
    pub header_event: Vec<u8>,
    /// `events/ftrace/*/format`.
    pub ftrace_formats: Vec<Vec<u8>>,
    /// `events/SYS/*/format`, grouped by subsystem (in first-seen order).
    pub event_formats: Vec<(String, Vec<Vec<u8>>)>,
    /// `/proc/kallsyms`-style `ADDR TYPE NAME` lines (may be empty).
    pub kallsyms: Vec<u8>,
    /// `printk_formats` (may be empty).
    pub printk_formats: Vec<u8>,
    /// `saved_cmdlines`: `PID COMM` lines.
    pub saved_cmdlines: Vec<u8>,
    /// `saved_tgids`: `PID TGID` lines (kept in memory; trace.dat has no place for them).
    pub saved_tgids: Vec<u8>,
    /// The clock's name (`local`, `counter`, ...), what `trace_clock` shows in brackets.
    pub trace_clock: String,
    /// Number of CPUs with a `per_cpu/cpuN` directory.
    pub cpus: usize,
    /// Bytes per ring-buffer page, from `header_page`.
    pub page_size: u32,
}

/// A file the tracefs does not have (an older kernel, no such CPU, an event gone).
fn not_found(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

/// `available_filter_functions_addrs` lines (`ADDR NAME [MODULE]`) as `/proc/kallsyms`
/// lines (`ADDR t NAME [MODULE]`), the form trace.dat keeps.
fn kallsyms_of_addrs(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + text.len() / 8);
    for line in String::from_utf8_lossy(text).lines() {
        let Some((addr, rest)) = line.split_once(' ') else {
            continue;
        };
        if addr.is_empty() || !addr.bytes().all(|b| b.is_ascii_hexdigit()) || rest.is_empty() {
            continue;
        }
        out.extend_from_slice(addr.as_bytes());
        out.extend_from_slice(b" t ");
        out.extend_from_slice(rest.as_bytes());
        out.push(b'\n');
    }
    out
}

fn context(e: io::Error, path: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{path}: {e}"))
}

impl TraceMeta {
    /// Reads everything from a tracefs. `read(path)` returns a file of the tracefs, path
    /// relative to its root (`"events/header_page"`, `"events/kv/get/format"`,
    /// `"saved_cmdlines"`, ...); `events` selects which event formats to take (`None`:
    /// every event of `available_events`). The ftrace events' formats are always taken
    /// (`ftrace:print` carries `trace_marker` writes).
    pub fn from_tracefs(
        read: &mut dyn FnMut(&str) -> io::Result<Vec<u8>>,
        events: Option<&[(String, String)]>,
    ) -> io::Result<TraceMeta> {
        let mut get = |path: &str| read(path).map_err(|e| context(e, path));
        let header_page = get("events/header_page")?;
        let header_event = get("events/header_event")?;
        let layout = PageLayout::parse(&String::from_utf8_lossy(&header_page))?;
        let list: Vec<(String, String)> = match events {
            Some(list) => list.to_vec(),
            None => String::from_utf8_lossy(&get("available_events")?)
                .lines()
                .filter_map(|l| {
                    let (s, e) = l.trim().split_once(':')?;
                    Some((s.to_string(), e.to_string()))
                })
                .collect(),
        };
        let mut ftrace_formats = Vec::new();
        let mut ftrace_seen = Vec::new();
        let ftrace_wanted = FTRACE_EVENTS.iter().map(|e| e.to_string()).chain(
            list.iter()
                .filter(|(s, _)| s == "ftrace")
                .map(|(_, e)| e.clone()),
        );
        for name in ftrace_wanted {
            if ftrace_seen.contains(&name) {
                continue;
            }
            match get(&format!("events/ftrace/{name}/format")) {
                Ok(text) => ftrace_formats.push(text),
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(e),
            }
            ftrace_seen.push(name);
        }
        let mut event_formats: Vec<(String, Vec<Vec<u8>>)> = Vec::new();
        let mut seen: HashMap<(String, String), ()> = HashMap::new();
        for (system, event) in &list {
            if system == "ftrace" || seen.insert((system.clone(), event.clone()), ()).is_some() {
                continue;
            }
            let text = match get(&format!("events/{system}/{event}/format")) {
                Ok(t) => t,
                // An event removed since available_events was read (a dynamic event).
                Err(e) if not_found(&e) && events.is_none() => continue,
                Err(e) => return Err(e),
            };
            match event_formats.iter_mut().find(|(s, _)| s == system) {
                Some((_, v)) => v.push(text),
                None => event_formats.push((system.clone(), vec![text])),
            }
        }
        let optional =
            |get: &mut dyn FnMut(&str) -> io::Result<Vec<u8>>, path: &str| match get(path) {
                Ok(v) => Ok(v),
                Err(e) if not_found(&e) => Ok(Vec::new()),
                Err(e) => Err(e),
            };
        let printk_formats = optional(&mut get, "printk_formats")?;
        let saved_cmdlines = optional(&mut get, "saved_cmdlines")?;
        let saved_tgids = optional(&mut get, "saved_tgids")?;
        let clock_text = String::from_utf8_lossy(&get("trace_clock")?).into_owned();
        let trace_clock = selected_clock(&clock_text).unwrap_or_else(|| "local".to_string());
        let mut cpus = 0;
        while cpus < 4096 {
            match get(&format!("per_cpu/cpu{cpus}/stats")) {
                Ok(_) => cpus += 1,
                Err(e) if not_found(&e) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(TraceMeta {
            header_page,
            header_event,
            ftrace_formats,
            event_formats,
            // The functions' addresses, as kallsyms lines, so that readers name the
            // functions of `function`/`funcgraph_*` records and probe addresses; a tracefs
            // without the file (or one that refuses it) leaves them as numbers.
            kallsyms: get("available_filter_functions_addrs")
                .map(|text| kallsyms_of_addrs(&text))
                .unwrap_or_default(),
            printk_formats,
            saved_cmdlines,
            saved_tgids,
            trace_clock,
            cpus,
            page_size: layout.page_size as u32,
        })
    }

    /// The page layout `header_page` describes.
    pub fn page_layout(&self) -> io::Result<PageLayout> {
        PageLayout::parse(&String::from_utf8_lossy(&self.header_page))
    }

    /// Every event format, parsed (ftrace's first).
    pub fn formats(&self) -> io::Result<Vec<EventFormat>> {
        let mut out = Vec::new();
        for text in &self.ftrace_formats {
            out.push(EventFormat::parse(
                "ftrace",
                &String::from_utf8_lossy(text),
            )?);
        }
        for (system, texts) in &self.event_formats {
            for text in texts {
                out.push(EventFormat::parse(system, &String::from_utf8_lossy(text))?);
            }
        }
        Ok(out)
    }

    /// `saved_cmdlines` as a map of thread id to name.
    pub fn cmdlines(&self) -> HashMap<i32, String> {
        parse_pairs(&self.saved_cmdlines, |s| Some(s.to_string()))
    }

    /// `saved_tgids` as a map of thread id to thread-group id.
    pub fn tgids(&self) -> HashMap<i32, i32> {
        parse_pairs(&self.saved_tgids, |s| s.parse().ok())
    }
}

fn parse_pairs<T>(text: &[u8], value: impl Fn(&str) -> Option<T>) -> HashMap<i32, T> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|l| {
            let (pid, rest) = l.trim_start().split_once(' ')?;
            Some((pid.parse().ok()?, value(rest.trim_end_matches('\n'))?))
        })
        .collect()
}

/// The name in brackets of a `trace_clock` file (`[local] global counter`), or the text
/// itself when it is a bare name.
pub fn selected_clock(text: &str) -> Option<String> {
    let text = text.trim();
    if let Some(start) = text.find('[') {
        let end = text[start..].find(']')? + start;
        return Some(text[start + 1..end].to_string());
    }
    (!text.is_empty() && !text.contains(' ')).then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_name_is_the_bracketed_one() {
        assert_eq!(
            selected_clock("local global [counter] mono\n").as_deref(),
            Some("counter")
        );
        assert_eq!(selected_clock("boot").as_deref(), Some("boot"));
    }

    #[test]
    fn cmdlines_keep_names_with_spaces() {
        let meta = TraceMeta {
            saved_cmdlines: b"12 kv worker\n7 sh\n".to_vec(),
            saved_tgids: b"12 10\n".to_vec(),
            ..TraceMeta::default()
        };
        assert_eq!(meta.cmdlines()[&12], "kv worker");
        assert_eq!(meta.tgids()[&12], 10);
    }

    #[test]
    fn function_addresses_become_kallsyms_lines() {
        let text = b"55d0c0a01149 parse\n7f00aa000010 malloc [libc.so.6]\nnot-an-address line\n\n";
        assert_eq!(
            kallsyms_of_addrs(text),
            b"55d0c0a01149 t parse\n7f00aa000010 t malloc [libc.so.6]\n".to_vec()
        );
    }
}
