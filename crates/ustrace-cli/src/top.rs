//! `ustrace top -p PID`: the function profiler of a running process, live.
//!
//! Over the process's control socket it turns `function_profile_enabled` on (after
//! `set_ftrace_filter` when `-F` names functions; an empty filter, every function, only
//! with `--all`), reads every `trace_stat/function<cpu>`
//! each interval, merges the CPUs and prints one table sorted by total time, like `perf top`
//! or `uftrace live`. On a terminal the table is redrawn in place; otherwise (or with
//! `--once`/`-n`) each refresh is printed after the previous one. Ctrl-C (or SIGTERM, SIGHUP)
//! ends it, and what it turned on is turned off again: the process is left as found.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use ustrace_ctl::client::{Client, CtlError};

use crate::remote::PidArg;

#[derive(clap::Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub target: PidArg,
    /// Seconds between refreshes.
    #[arg(short, long, default_value_t = 1.0, value_name = "SECS")]
    pub delay: f64,
    /// Stop after this many refreshes.
    #[arg(short = 'n', long = "iterations", value_name = "ITER")]
    pub iterations: Option<u64>,
    /// One refresh, printed as plain text (the same as `-n 1`).
    #[arg(long)]
    pub once: bool,
    /// Profile only the functions this glob names (written to `set_ftrace_filter`, which
    /// must be empty, and emptied again at the end); default: what the filter selects now.
    #[arg(short = 'F', long = "filter", value_name = "GLOB")]
    pub filter: Option<String>,
    /// Profile every function of the process when `set_ftrace_filter` is empty (without
    /// it, `top` asks for `-F` or a filter rather than patch the whole program).
    #[arg(long, conflicts_with = "filter")]
    pub all: bool,
    /// Show at most this many functions (default: what fits the terminal, else all).
    #[arg(short, long, value_name = "N")]
    pub lines: Option<usize>,
}

/// One function, all CPUs merged.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    /// The name as `trace_stat` prints it (cut at 30 characters, as the kernel's).
    pub name: String,
    /// Calls.
    pub hits: u64,
    /// Total time, ns.
    pub time_ns: f64,
    /// Sum of squared durations, ns², rebuilt from each CPU's average and s².
    pub time_sq: f64,
}

impl Row {
    fn avg_ns(&self) -> f64 {
        if self.hits == 0 {
            0.0
        } else {
            self.time_ns / self.hits as f64
        }
    }

    /// The sample standard deviation of the durations, ns.
    fn stddev_ns(&self) -> f64 {
        let n = self.hits as f64;
        if self.hits < 2 {
            return 0.0;
        }
        let var = (n * self.time_sq - self.time_ns * self.time_ns) / (n * (n - 1.0));
        var.max(0.0).sqrt()
    }
}

/// Parses one `trace_stat/function<cpu>` text into rows: name, hit count, then three
/// durations printed in µs (`TIME us  AVG us  S2 us`, the last in µs² as the kernel's
/// duration printer shows ns²/1000).
pub fn parse_stat(text: &str) -> Vec<Row> {
    let mut out = Vec::new();
    for line in text.lines().skip(2) {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() < 8 {
            continue;
        }
        let n = words.len();
        let tail = &words[n - 7..];
        let (Ok(hits), Some(time), Some(avg), Some(s2)) = (
            tail[0].parse::<u64>(),
            micros(tail[1], tail[2]),
            micros(tail[3], tail[4]),
            micros(tail[5], tail[6]),
        ) else {
            continue;
        };
        let n_hits = hits as f64;
        // s² printed = (n·Σx² − (Σx)²) / (n(n−1)·1000) ns² read as µs: undo both.
        let time_ns = time * 1000.0;
        let s2_ns2 = s2 * 1000.0 * 1000.0;
        let time_sq = if hits > 1 {
            (s2_ns2 * n_hits * (n_hits - 1.0) + time_ns * time_ns) / n_hits
        } else {
            (avg * 1000.0).powi(2) * n_hits
        };
        out.push(Row {
            name: words[..n - 7].join(" "),
            hits,
            time_ns,
            time_sq,
        });
    }
    out
}

fn micros(value: &str, unit: &str) -> Option<f64> {
    (unit == "us").then_some(())?;
    value.parse::<f64>().ok()
}

/// Merges the CPUs' rows by name, largest total time first.
pub fn merge(per_cpu: Vec<Vec<Row>>) -> Vec<Row> {
    let mut by_name: HashMap<String, Row> = HashMap::new();
    for row in per_cpu.into_iter().flatten() {
        let e = by_name.entry(row.name.clone()).or_insert_with(|| Row {
            name: row.name.clone(),
            ..Row::default()
        });
        e.hits += row.hits;
        e.time_ns += row.time_ns;
        e.time_sq += row.time_sq;
    }
    let mut rows: Vec<Row> = by_name.into_values().collect();
    rows.sort_by(|a, b| {
        b.time_ns
            .total_cmp(&a.time_ns)
            .then(b.hits.cmp(&a.hits))
            .then_with(|| a.name.cmp(&b.name))
    });
    rows
}

/// A duration for people: ns, µs, ms or s with three significant digits or so.
fn human(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// The table of one refresh: a summary line, the header, then the rows (with the calls
/// since the previous refresh per second).
pub fn render(
    pid: u32,
    rows: &[Row],
    previous: &HashMap<String, u64>,
    elapsed: Duration,
    limit: Option<usize>,
) -> String {
    let total_hits: u64 = rows.iter().map(|r| r.hits).sum();
    let mut out = format!(
        "ustrace top: pid {pid}, functions hit: {}, calls: {total_hits}\n",
        rows.len()
    );
    out.push_str(&format!(
        "{:>12} {:>10} {:>11} {:>11} {:>11}  {}\n",
        "HITS", "HITS/s", "TIME", "AVG", "STDDEV", "FUNCTION"
    ));
    let secs = elapsed.as_secs_f64().max(1e-9);
    for r in rows.iter().take(limit.unwrap_or(usize::MAX)) {
        let before = previous.get(&r.name).copied().unwrap_or(0);
        let rate = r.hits.saturating_sub(before) as f64 / secs;
        out.push_str(&format!(
            "{:>12} {:>10.0} {:>11} {:>11} {:>11}  {}\n",
            r.hits,
            rate,
            human(r.time_ns),
            human(r.avg_ns()),
            human(r.stddev_ns()),
            r.name
        ));
    }
    out
}

fn failed(path: &str, e: CtlError) -> String {
    match e {
        CtlError::Remote { errno, .. } => format!("{path}: {errno}"),
        other => format!("{path}: {other}"),
    }
}

/// Reads every CPU's profile of the process.
fn read_stats(client: &mut Client) -> Result<Vec<Row>, String> {
    let mut names: Vec<String> = client
        .readdir("trace_stat")
        .map_err(|e| failed("trace_stat", e))?
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n.starts_with("function"))
        .collect();
    names.sort();
    let mut per_cpu = Vec::new();
    for name in names {
        let path = format!("trace_stat/{name}");
        let text = client.read_file(&path).map_err(|e| failed(&path, e))?;
        per_cpu.push(parse_stat(&String::from_utf8_lossy(&text)));
    }
    Ok(merge(per_cpu))
}

/// The signals that end `top`, blocked so that they are taken by `sigtimedwait` between
/// refreshes (and the cleanup always runs).
fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Waits `delay`, or less when a stop signal comes; true when one came.
fn wait_or_signal(set: &libc::sigset_t, delay: Duration) -> bool {
    let deadline = Instant::now() + delay;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let ts = libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: set and ts are valid for the call; no siginfo is asked for.
        let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
        if sig > 0 {
            return true;
        }
        let err = std::io::Error::last_os_error().raw_os_error();
        if err != Some(libc::EINTR) && err != Some(libc::EAGAIN) {
            return false;
        }
    }
}

/// The terminal's height in rows, when stdout is one.
fn terminal_rows() -> Option<usize> {
    // SAFETY: winsize is plain data, filled by the ioctl on success.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes a winsize into the pointer given.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0).then_some(ws.ws_row as usize)
}

/// What `top` changed in the process, to undo at the end.
struct Undo {
    profiler: bool,
    filter: bool,
}

fn restore(client: &mut Client, undo: &Undo) -> Result<(), String> {
    let mut first_err = None;
    if undo.profiler {
        if let Err(e) = client.write_file("function_profile_enabled", b"0\n", false) {
            first_err.get_or_insert(failed("function_profile_enabled", e));
        }
    }
    if undo.filter {
        if let Err(e) = client.write_file("set_ftrace_filter", b"", false) {
            first_err.get_or_insert(failed("set_ftrace_filter", e));
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Whether a line of `set_ftrace_filter` names a function: not the "all functions" line,
/// not a command (`FUNC:traceon:unlimited`, `...:count=3`) and not a remembered `:mod:`
/// word. (Rust names have `::` in them, so a colon alone says nothing.)
fn names_a_function(line: &str) -> bool {
    if line.starts_with('#') || line.trim().is_empty() || line.contains(":mod:") {
        return false;
    }
    let command = line.ends_with(":unlimited")
        || line.rsplit_once(":count=").is_some_and(|(_, n)| {
            let n = n.strip_prefix('-').unwrap_or(n);
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
        });
    !command
}

pub fn run(args: TopArgs) -> Result<(), String> {
    if !(args.delay.is_finite() && args.delay > 0.0) {
        return Err(format!("--delay {}: must be a positive number", args.delay));
    }
    let iterations = if args.once { Some(1) } else { args.iterations };
    let live = iterations.is_none() && std::io::stdout().is_terminal();
    let set = stop_signals();
    // SAFETY: blocks the stop signals in this (the only) thread.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };

    let pid = args.target.pid;
    let mut client = Client::connect(pid).map_err(|e| e.to_string())?;
    let mut undo = Undo {
        profiler: false,
        filter: false,
    };
    let current = client
        .read_file("set_ftrace_filter")
        .map_err(|e| failed("set_ftrace_filter", e))?;
    let filtered = String::from_utf8_lossy(&current)
        .lines()
        .any(names_a_function);
    if let Some(glob) = &args.filter {
        if filtered {
            return Err(
                "set_ftrace_filter already names functions: clear it, or run without -F".into(),
            );
        }
        client
            .write_file("set_ftrace_filter", format!("{glob}\n").as_bytes(), false)
            .map_err(|e| failed("set_ftrace_filter", e))?;
        undo.filter = true;
    } else if !filtered && !args.all {
        return Err(
            "set_ftrace_filter is empty, which profiles every function of the process: \
             name some with -F GLOB, or pass --all"
                .into(),
        );
    }
    let was_on = client
        .read_file("function_profile_enabled")
        .map_err(|e| failed("function_profile_enabled", e))?;
    if String::from_utf8_lossy(&was_on).trim() != "1" {
        if let Err(e) = client.write_file("function_profile_enabled", b"1\n", false) {
            let _ = restore(&mut client, &undo);
            return Err(failed("function_profile_enabled", e));
        }
        undo.profiler = true;
    }

    let result = refresh_loop(&mut client, &args, iterations, live, &set);
    let restored = restore(&mut client, &undo);
    if live {
        out!("\x1b[?25h");
    }
    result.and(restored)
}

fn refresh_loop(
    client: &mut Client,
    args: &TopArgs,
    iterations: Option<u64>,
    live: bool,
    set: &libc::sigset_t,
) -> Result<(), String> {
    let delay = Duration::from_secs_f64(args.delay);
    let mut previous: HashMap<String, u64> = HashMap::new();
    let mut last = Instant::now();
    let mut done = 0u64;
    loop {
        if wait_or_signal(set, delay) {
            return Ok(());
        }
        let rows = read_stats(client)?;
        let now = Instant::now();
        let limit = args.lines.or_else(|| {
            live.then(terminal_rows)
                .flatten()
                .map(|h| h.saturating_sub(3))
        });
        let table = render(args.target.pid, &rows, &previous, now - last, limit);
        if live {
            // Home, clear, hide the cursor: one redraw per refresh.
            out!("\x1b[H\x1b[2J\x1b[?25l{table}");
        } else {
            if done > 0 {
                outln!();
            }
            out!("{table}");
        }
        previous = rows.into_iter().map(|r| (r.name, r.hits)).collect();
        last = now;
        done += 1;
        if iterations.is_some_and(|n| done >= n) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPU0: &str = "  Function                               Hit    Time            Avg             s^2\n  --------                               ---    ----            ---             ---\n  fp_mid                                  3    6.000 us        2.000 us        1.000 us    \n  <T as core::fmt::Debug>::fmt            1    1234567 us      1234567 us      0.000 us    \n";

    #[test]
    fn stat_lines_parse_and_cpus_merge() {
        let rows = parse_stat(CPU0);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].name, "fp_mid");
        assert_eq!(rows[0].hits, 3);
        assert_eq!(rows[0].time_ns, 6000.0);
        // Durations 1, 2, 3 µs: Σx² = 14 µs².
        assert!((rows[0].time_sq - 14e6).abs() < 1.0, "{}", rows[0].time_sq);
        assert_eq!(rows[1].name, "<T as core::fmt::Debug>::fmt");
        let merged = merge(vec![rows.clone(), rows]);
        assert_eq!(merged[0].name, "<T as core::fmt::Debug>::fmt");
        assert_eq!(merged[1].hits, 6);
        // Six samples 1,2,3,1,2,3 µs: sample stddev sqrt(4/5) µs.
        assert!((merged[1].stddev_ns() - (0.8f64).sqrt() * 1000.0).abs() < 1.0);
    }

    #[test]
    fn filter_lines_that_name_functions() {
        assert!(names_a_function("fp_mid"));
        assert!(names_a_function("my_crate::kv::Store::get"));
        assert!(names_a_function("memcpy [libc.so.6]"));
        assert!(!names_a_function("#### all functions enabled ####"));
        assert!(!names_a_function("fp_mid:traceoff:unlimited"));
        assert!(!names_a_function("my_crate::f:enable_event:kv:get:count=2"));
        assert!(!names_a_function("f:traceon:count=-1"));
        assert!(!names_a_function("*:mod:libfoo"));
    }

    #[test]
    fn the_table_shows_rates_since_the_last_refresh() {
        let rows = parse_stat(CPU0);
        let previous: HashMap<String, u64> = [("fp_mid".to_string(), 1)].into();
        let t = render(7, &rows, &previous, Duration::from_secs(2), Some(1));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "ustrace top: pid 7, functions hit: 2, calls: 4");
        assert!(lines[1].contains("HITS/s"));
        assert_eq!(
            lines[2],
            "           3          1     6.00 us     2.00 us     1.00 us  fp_mid"
        );
    }
}
