//! `ustrace report [FILE]`: a trace.dat printed as `trace-cmd report` prints it.
//!
//! The file is read with `ustrace-tracedat`'s reader (events of every CPU merged by time)
//! and each event printed with its format's `print fmt`, in libtraceevent's layout, so the
//! real trace-cmd and this verb print the same lines for the same file. Offline options
//! narrow what is printed (`--cpu`, `-F`); `--stats` prints the per-CPU counts stored at
//! the end of the recording instead of the events.

use std::path::PathBuf;

use ustrace_tracedat::{Printer, Reader};

#[derive(clap::Args)]
pub struct ReportArgs {
    /// The trace.dat file to read.
    #[arg(default_value = "trace.dat")]
    pub file: PathBuf,
    /// Only events recorded on these CPUs (`--cpu 1`, `--cpu 0,2-3`; repeatable).
    #[arg(long = "cpu", value_name = "CPUS")]
    pub cpus: Vec<String>,
    /// Only these events: `SYS`, `SYS:EVENT`, `SYS/EVENT` or `EVENT` (repeatable).
    #[arg(short = 'F', long = "event", value_name = "EVENT")]
    pub events: Vec<String>,
    /// Print each event's fields as `name=value` instead of its print format (as
    /// `trace-cmd report -R`).
    #[arg(short = 'R', long)]
    pub raw: bool,
    /// Print the per-CPU statistics stored in the file (entries, overrun, lost events)
    /// and the events and lost-event marks found in the pages, instead of the events.
    #[arg(long, alias = "stat")]
    pub stats: bool,
}

/// `0,2-3` into CPU numbers.
fn parse_cpus(lists: &[String]) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for list in lists {
        for part in list.split(',').filter(|p| !p.is_empty()) {
            let bad = || format!("--cpu: bad CPU list {list:?}");
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b): (u32, u32) =
                        (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                    if a > b || b - a > 65536 {
                        return Err(bad());
                    }
                    out.extend(a..=b);
                }
                None => out.push(part.parse().map_err(|_| bad())?),
            }
        }
    }
    Ok(out)
}

/// Whether an event selector (`SYS`, `SYS:EVENT`, `SYS/EVENT`, `EVENT`) takes `sys:name`.
fn selects(selector: &str, system: &str, name: &str) -> bool {
    match selector.split_once([':', '/']) {
        Some((s, e)) => s == system && (e.is_empty() || e == "*" || e == name),
        None => selector == system || selector == name,
    }
}

pub fn run(args: ReportArgs) -> Result<(), String> {
    let path = &args.file;
    let reader = Reader::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cpus = parse_cpus(&args.cpus)?;
    outln!("cpus={}", reader.meta().cpus);
    if args.stats {
        return stats(&reader);
    }
    let printer = Printer::for_reader(&reader);
    let mut failures = 0usize;
    for ev in reader.events() {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                // A corrupt page loses only itself: say so and go on.
                eprintln!("ustrace report: {}: {e}", path.display());
                failures += 1;
                continue;
            }
        };
        if !cpus.is_empty() && !cpus.contains(&ev.cpu) {
            continue;
        }
        if !args.events.is_empty() && !args.events.iter().any(|s| selects(s, &ev.system, &ev.name))
        {
            continue;
        }
        outln!("{}", printer.line(&ev, args.raw));
    }
    if failures > 0 {
        return Err(format!(
            "{}: {failures} page(s) could not be decoded",
            path.display()
        ));
    }
    Ok(())
}

fn stats(reader: &Reader) -> Result<(), String> {
    let n = reader.meta().cpus;
    let mut events = vec![0u64; n];
    let mut lost = vec![0u64; n];
    let mut lost_unknown = vec![0u64; n];
    for ev in reader.events() {
        let ev = ev.map_err(|e| e.to_string())?;
        let cpu = ev.cpu as usize;
        if cpu < n {
            events[cpu] += 1;
            match ev.missed_events {
                m if m > 0 => lost[cpu] += m as u64,
                m if m < 0 => lost_unknown[cpu] += 1,
                _ => {}
            }
        }
    }
    outln!();
    outln!("Buffer statistics at the end of the recording:");
    for (cpu, text) in reader.cpu_stats() {
        outln!();
        outln!("CPU: {cpu}");
        out!("{text}");
    }
    outln!();
    outln!("In the file:");
    for cpu in 0..n {
        let (offset, size) = reader.cpu_data().get(cpu).copied().unwrap_or((0, 0));
        let unknown = if lost_unknown[cpu] > 0 {
            format!(" (+{} losses of unknown size)", lost_unknown[cpu])
        } else {
            String::new()
        };
        outln!(
            "CPU{cpu}: {} events, {} lost{unknown}, {size} bytes at offset 0x{offset:x}",
            events[cpu],
            lost[cpu]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_and_selectors() {
        assert_eq!(
            parse_cpus(&["0,2-3".into(), "5".into()]).unwrap(),
            [0, 2, 3, 5]
        );
        assert!(parse_cpus(&["3-1".into()]).is_err());
        assert!(selects("kv", "kv", "get"));
        assert!(selects("kv:get", "kv", "get") && selects("kv/get", "kv", "get"));
        assert!(selects("get", "kv", "get"));
        assert!(!selects("kv:put", "kv", "get"));
    }
}
