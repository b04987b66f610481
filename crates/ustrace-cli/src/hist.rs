//! `ustrace hist`: an event's `hist` file drawn as terminal bar charts, and a flame graph
//! (SVG or folded stacks) of a stacktrace-keyed one.
//!
//! The hist text comes from a running process's tracefs over its control socket (as `ustrace
//! cat`), from a tracefs directory (the kernel's `/sys/kernel/tracing` or a ustrace FUSE
//! mount), or from a saved file; `parse` reads it, `chart` draws each section, `flame`
//! folds the stacks.

mod chart;
mod flame;
mod parse;

use std::io::Read;
use std::path::{Path, PathBuf};
use ustrace_ctl::client::{Client, CtlError};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("source").args(["pid", "file", "tracefs"]).required(true)))]
pub struct HistArgs {
    /// The event, as SYSTEM:EVENT or SYSTEM/EVENT (e.g. `kv:get`); optional with --file.
    pub event: Option<String>,
    /// Read the hist of this process's tracefs (see `ustrace ps`).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pid: Option<u32>,
    /// Read a tracefs directory instead, e.g. /sys/kernel/tracing or a `ustrace mount`.
    #[arg(long, value_name = "DIR")]
    pub tracefs: Option<PathBuf>,
    /// Read a saved hist file (`-` for standard input).
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// The instance whose event to read (`instances/NAME/events/…`).
    #[arg(short, long, value_name = "NAME")]
    pub instance: Option<String>,
    /// Size bars (and weight stacks) by this value instead of hitcount.
    #[arg(long, value_name = "NAME")]
    pub value: Option<String>,
    /// Draw one distribution over all other keys instead of one per value of them.
    #[arg(long)]
    pub merge: bool,
    /// Only this section (1 = the first hist trigger of the event).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub section: Option<u32>,
    /// Write a flame graph of the stacktrace-keyed section to FILE (SVG).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Write its folded stacks (flamegraph.pl / inferno input) to FILE.
    #[arg(long, value_name = "FILE")]
    pub folded: Option<PathBuf>,
}

/// `SYS:EVENT` or `SYS/EVENT` → (`SYS`, `EVENT`).
fn split_event(event: &str) -> Result<(&str, &str), String> {
    let (sys, name) = event
        .split_once(':')
        .or_else(|| event.split_once('/'))
        .ok_or_else(|| format!("`{event}`: name the event as SYSTEM:EVENT or SYSTEM/EVENT"))?;
    let ok = |s: &str| !s.is_empty() && !s.contains(['/', ':']) && s != "." && s != "..";
    if !ok(sys) || !ok(name) {
        return Err(format!(
            "`{event}`: name the event as SYSTEM:EVENT or SYSTEM/EVENT"
        ));
    }
    Ok((sys, name))
}

/// The hist file's path inside a tracefs.
fn hist_path(args: &HistArgs, event: &str) -> Result<String, String> {
    let (sys, name) = split_event(event)?;
    Ok(match &args.instance {
        Some(i) => format!("instances/{i}/events/{sys}/{name}/hist"),
        None => format!("events/{sys}/{name}/hist"),
    })
}

fn read_source(args: &HistArgs) -> Result<(String, String), String> {
    if let Some(path) = &args.file {
        let mut raw = Vec::new();
        if path == Path::new("-") {
            std::io::stdin()
                .read_to_end(&mut raw)
                .map_err(|e| format!("standard input: {e}"))?;
        } else {
            raw = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let title = args
            .event
            .clone()
            .unwrap_or_else(|| path.display().to_string());
        return Ok((title, String::from_utf8_lossy(&raw).into_owned()));
    }
    let event = args
        .event
        .as_deref()
        .ok_or("name the event: ustrace hist -p PID SYSTEM:EVENT")?;
    let path = hist_path(args, event)?;
    let raw = if let Some(dir) = &args.tracefs {
        let full = dir.join(&path);
        std::fs::read(&full).map_err(|e| {
            let mut m = format!("{}: {e}", full.display());
            if e.kind() == std::io::ErrorKind::NotFound {
                if full.parent().is_some_and(|p| p.is_dir()) {
                    m.push_str(
                        " (the event has no hist file: a kernel built without CONFIG_HIST_TRIGGERS?)",
                    );
                } else {
                    m.push_str(&format!(" (no event {event} there)"));
                }
            }
            m
        })?
    } else {
        let pid = args
            .pid
            .ok_or("say where the hist is: -p PID, --tracefs DIR or --file PATH")?;
        let mut client = Client::connect(pid).map_err(|e| e.to_string())?;
        client.read_file(&path).map_err(|e| match e {
            CtlError::Remote { errno, .. } => format!("{path}: {errno}"),
            other => format!("{path}: {other}"),
        })?
    };
    Ok((event.to_owned(), String::from_utf8_lossy(&raw).into_owned()))
}

/// Terminal columns: `COLUMNS`, else the terminal's own width, else 80.
fn columns() -> usize {
    if let Some(n) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n.max(20);
    }
    // SAFETY: winsize is plain data; all zeroes is a valid value.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into the pointer, valid for the call.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 {
        return usize::from(ws.ws_col).max(20);
    }
    80
}

pub fn run(args: HistArgs) -> Result<(), String> {
    let (title, text) = read_source(&args)?;
    let hist = parse::parse(&text).map_err(|e| format!("{title}: {e}"))?;
    if hist.sections.is_empty() {
        return Err(format!(
            "{title}: the hist file is empty: the event has no hist trigger \
             (add one, e.g. echo 'hist:keys=common_pid' > events/SYS/EVENT/trigger)"
        ));
    }
    let picked: Vec<(usize, &parse::Section)> = match args.section {
        Some(n) => {
            let n = n as usize;
            let s = hist.sections.get(n - 1).ok_or_else(|| {
                format!(
                    "{title}: no section {n}: the hist has {}",
                    hist.sections.len()
                )
            })?;
            vec![(n, s)]
        }
        None => hist
            .sections
            .iter()
            .enumerate()
            .map(|(i, s)| (i + 1, s))
            .collect(),
    };
    let opts = chart::Options {
        width: columns(),
        value: args.value.as_deref(),
        merge: args.merge,
    };
    let mut value_found = args.value.is_none();
    for (n, (num, section)) in picked.iter().enumerate() {
        if n > 0 {
            outln!();
        }
        match &section.trigger {
            Some(t) => outln!("{title}  {t}"),
            None => outln!("{title}  (section {num})"),
        }
        outln!();
        // A value asked for must exist somewhere; a section without it says so.
        let drawn = match chart::draw(section, &opts) {
            Ok(text) => {
                value_found |= !section.entries.is_empty();
                text
            }
            Err(e) if picked.len() > 1 => format!("({e})\n"),
            Err(e) => return Err(format!("{title}: {e}")),
        };
        out!("{drawn}");
        for line in &section.other {
            if line.trim() != "." {
                outln!("{line}");
            }
        }
        if let Some(t) = &section.totals {
            let show = |v: Option<u64>| v.map_or("?".to_owned(), |v| v.to_string());
            out!(
                "Hits: {}  Entries: {}  Dropped: {}",
                show(t.hits),
                show(t.entries),
                show(t.dropped)
            );
            if t.dropped.is_some_and(|d| d > 0) {
                out!("  (the table was full: raise the trigger's size=)");
            }
            outln!();
        }
    }
    if !value_found {
        return Err(format!(
            "{title}: no section has a value named `{}`",
            args.value.as_deref().unwrap_or("")
        ));
    }
    if args.svg.is_some() || args.folded.is_some() {
        write_flame(&args, &title, &picked)?;
    }
    Ok(())
}

fn write_flame(
    args: &HistArgs,
    title: &str,
    picked: &[(usize, &parse::Section)],
) -> Result<(), String> {
    let stacked: Vec<&(usize, &parse::Section)> =
        picked.iter().filter(|(_, s)| flame::has_stack(s)).collect();
    let Some(&&(num, section)) = stacked.first() else {
        return Err(format!(
            "{title}: no section is keyed by a stack: a flame graph needs \
             keys=common_stacktrace (or a FIELD.stacktrace key)"
        ));
    };
    if stacked.len() > 1 {
        eprintln!(
            "ustrace: {title}: {} sections are keyed by stacks; the flame graph is of section \
             {num} (choose with --section N)",
            stacked.len()
        );
    }
    let value = chart::chosen_value(section, args.value.as_deref())
        .map_err(|e| format!("{title}: {e}"))?
        .unwrap_or_else(|| "hitcount".to_owned());
    let stacks = flame::folded(section, &value);
    if let Some(path) = &args.folded {
        std::fs::write(path, flame::folded_text(&stacks))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!(
            "ustrace: wrote {} ({} stacks)",
            path.display(),
            stacks.len()
        );
    }
    if let Some(path) = &args.svg {
        let heading = format!("{title} by {value}");
        std::fs::write(path, flame::svg(&stacks, &heading, &value))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("ustrace: wrote {}", path.display());
    }
    Ok(())
}
