//! The function profiler: `function_profile_enabled` and `trace_stat/function<cpu>`
//! (ftrace.rst, "function profiler"; the kernel's `ftrace_profile_*` in ftrace.c).
//!
//! Writing 1 to `function_profile_enabled` attaches one fprobe (entry and exit) to the
//! functions `set_ftrace_filter`/`set_ftrace_notrace` select (every patchable function when
//! the filter is empty). Each hit lands in a table allocated before anything is patched:
//!
//! ```text
//!   patched fn ── fprobe entry ── index = binary search of entry_ip in `addrs`
//!        │                        rows[cpu][index].hits += 1; entry_data = (index, child
//!        │                        time, now)
//!        ▼
//!   return ───── fprobe exit ──── d = now - start (minus callees' time when graph-time off)
//!                                 rows[cpu][index].time += d, .time_sq += d*d
//! ```
//!
//! A row is three relaxed atomic counters, so a hit takes no lock, allocates nothing and
//! makes no system call (the CPU comes from rseq, the clock from the TSC). Like the kernel,
//! the hit is counted on the CPU that entered the function and the time on the CPU that saw
//! it return. Writing 0 unpatches and keeps the numbers for reading; the next 1 starts
//! from zero. `trace_stat/function<cpu>` prints one CPU's rows in the kernel's layout
//! (function graph configured: hit, time, average and s², durations in µs), largest time
//! first.
//!
//! `graph-time` off reports a function's own time: the time of profiled callees is
//! subtracted, as the kernel does through its return stack. There is
//! no `sleep-time` here: a user-space probe cannot see when its thread is scheduled out
//! without a system call, so times always include sleeping (the kernel's default).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ustrace_fprobe::{EntryAction, Fprobe};
use ustrace_ringbuf::clock::{self, Clock};

/// One function's counters on one CPU.
#[derive(Default)]
struct Row {
    hits: AtomicU64,
    time: AtomicU64,
    time_sq: AtomicU64,
}

/// A profile: the functions it covers and their per-CPU counters.
pub struct Profile {
    /// Function start addresses, sorted: the hit path's key.
    addrs: Box<[usize]>,
    names: Box<[String]>,
    cpus: usize,
    /// `cpus * addrs.len()` rows, CPU-major so one CPU's rows share no line with another's.
    rows: Box<[Row]>,
    /// Whether a function's time includes its profiled callees' (the `graph-time` option).
    graph_time: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profile")
            .field("functions", &self.addrs.len())
            .field("cpus", &self.cpus)
            .finish()
    }
}

/// One function's numbers, as `trace_stat/function<cpu>` shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// The function's name.
    pub name: String,
    /// Its start address.
    pub addr: usize,
    /// Calls entered.
    pub hits: u64,
    /// Sum of call durations, ns.
    pub time: u64,
    /// Sum of squared call durations, ns² (wrapping, as the kernel's).
    pub time_sq: u64,
}

impl Stat {
    /// Average duration in ns (0 with no hits).
    pub fn avg(&self) -> u64 {
        self.time.checked_div(self.hits).unwrap_or(0)
    }

    /// Sample variance in the unit the kernel prints (ns² / 1000, shown by the duration
    /// printer as µs²): `(n·Σx² − (Σx)²) / (n·(n−1)·1000)`, 0 for fewer than two calls.
    pub fn s2(&self) -> u64 {
        let n = self.hits as u128;
        if n < 2 {
            return 0;
        }
        let num = (n * self.time_sq as u128).saturating_sub(self.time as u128 * self.time as u128);
        u64::try_from(num / (n * (n - 1) * 1000)).unwrap_or(u64::MAX)
    }
}

thread_local! {
    /// Time spent so far in profiled callees of the innermost profiled call of this thread
    /// (for `graph-time` off). Const-initialised and without a destructor: a plain TLS slot.
    static CHILD_TIME: Cell<u64> = const { Cell::new(0) };
}

impl Profile {
    /// A zeroed profile of `funcs` (address, name) for `cpus` CPUs.
    fn new(
        mut funcs: Vec<(usize, String)>,
        cpus: usize,
        graph_time: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Profile {
        funcs.sort_by_key(|f| f.0);
        funcs.dedup_by_key(|f| f.0);
        let rows = (0..funcs.len() * cpus).map(|_| Row::default()).collect();
        let (addrs, names): (Vec<usize>, Vec<String>) = funcs.into_iter().unzip();
        Profile {
            addrs: addrs.into(),
            names: names.into(),
            cpus,
            rows,
            graph_time,
        }
    }

    /// The row of function `index` on the calling thread's CPU.
    #[inline]
    fn row(&self, index: usize) -> Option<&Row> {
        let cpu = ustrace_ringbuf::cpu::current_cpu();
        // A CPU beyond the table (hot-plugged later) shares the last CPU's rows.
        let cpu = cpu.min(self.cpus - 1);
        self.rows.get(cpu * self.addrs.len() + index)
    }

    /// Entry: count the hit and remember the function, the start and the callees' time so
    /// far (`entry_data`: index, start, outer callees' time).
    #[inline]
    fn enter(&self, ip: usize, data: &mut [u8]) -> EntryAction {
        let Ok(index) = self.addrs.binary_search(&ip) else {
            return EntryAction::SkipExit;
        };
        let Some(row) = self.row(index) else {
            return EntryAction::SkipExit;
        };
        row.hits.fetch_add(1, Ordering::Relaxed);
        let outer = CHILD_TIME.with(|c| c.replace(0));
        data[..8].copy_from_slice(&(index as u64).to_ne_bytes());
        data[8..16].copy_from_slice(&outer.to_ne_bytes());
        data[16..24].copy_from_slice(&clock::now(Clock::Local).to_ne_bytes());
        EntryAction::Continue
    }

    /// Exit: add the call's duration (its own part when `graph-time` is off) on the CPU
    /// that sees the return.
    #[inline]
    fn exit(&self, data: &[u8]) {
        let now = clock::now(Clock::Local);
        let word = |at: usize| u64::from_ne_bytes(data[at..at + 8].try_into().unwrap_or_default());
        let (index, outer, start) = (word(0) as usize, word(8), word(16));
        let total = now.saturating_sub(start);
        let callees = CHILD_TIME.with(|c| c.replace(outer.saturating_add(total)));
        let d = if (self.graph_time)() {
            total
        } else {
            total.saturating_sub(callees)
        };
        if let Some(row) = self.row(index) {
            row.time.fetch_add(d, Ordering::Relaxed);
            row.time_sq.fetch_add(d.wrapping_mul(d), Ordering::Relaxed);
        }
    }

    /// Number of functions covered.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Whether it covers no function.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Number of CPUs it has rows for.
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// The functions hit on `cpu` (all CPUs summed when `None`), largest time first, then
    /// most hits, then by name: a stable order for equal keys.
    pub fn stats(&self, cpu: Option<usize>) -> Vec<Stat> {
        let n = self.addrs.len();
        let cpus: Vec<usize> = match cpu {
            Some(c) if c < self.cpus => vec![c],
            Some(_) => Vec::new(),
            None => (0..self.cpus).collect(),
        };
        let mut out: Vec<Stat> = (0..n)
            .filter_map(|i| {
                let mut s = Stat {
                    name: self.names[i].clone(),
                    addr: self.addrs[i],
                    hits: 0,
                    time: 0,
                    time_sq: 0,
                };
                for &c in &cpus {
                    let row = &self.rows[c * n + i];
                    s.hits += row.hits.load(Ordering::Relaxed);
                    s.time = s.time.wrapping_add(row.time.load(Ordering::Relaxed));
                    s.time_sq = s.time_sq.wrapping_add(row.time_sq.load(Ordering::Relaxed));
                }
                (s.hits != 0).then_some(s)
            })
            .collect();
        out.sort_by(|a, b| {
            b.time
                .cmp(&a.time)
                .then(b.hits.cmp(&a.hits))
                .then_with(|| a.name.cmp(&b.name))
        });
        out
    }
}

/// The header of `trace_stat/function<cpu>` (the kernel's, function graph configured).
pub const HEADER: &str = "  Function                               Hit    Time            Avg             s^2\n  --------                               ---    ----            ---             ---\n";

/// A duration as the function graph prints it (`trace_print_graph_duration`): µs with three
/// decimals while the integer part has fewer than 7 digits (fewer decimals as it grows),
/// then ` us `, padded to a column of 8 characters before the unit.
pub fn write_duration(out: &mut String, ns: u64) {
    let usecs = (ns / 1000).to_string();
    let rem = ns % 1000;
    out.push_str(&usecs);
    let mut len = usecs.len();
    if len < 7 {
        // The kernel's snprintf into min(5, 8 - len) bytes keeps 7 - len digits of "%03lu".
        let digits = format!("{rem:03}");
        let keep = digits.len().min(7 - len).min(4);
        out.push('.');
        out.push_str(&digits[..keep]);
        len += keep + 1;
    }
    out.push_str(" us ");
    for _ in len..8 {
        out.push(' ');
    }
}

/// The text of `trace_stat/function<cpu>` for these rows: the header, then per function
/// `  %-30.30s  %10lu    TIME    AVG    S2` as the kernel's `function_stat_show`. Functions
/// whose average is below `thresh_ns` (when not 0, `tracing_thresh`) are left out.
pub fn format_stats(stats: &[Stat], thresh_ns: u64) -> String {
    let mut out = String::from(HEADER);
    for s in stats {
        let avg = s.avg();
        if thresh_ns != 0 && avg < thresh_ns {
            continue;
        }
        let name: String = s.name.chars().take(30).collect();
        out.push_str(&format!("  {name:<30}  {:>10}    ", s.hits));
        write_duration(&mut out, s.time);
        out.push_str("    ");
        write_duration(&mut out, avg);
        out.push_str("    ");
        write_duration(&mut out, s.s2());
        out.push('\n');
    }
    out
}

/// Why enabling the profiler failed.
#[derive(Debug)]
pub enum Error {
    /// No function selected (or none could be patched).
    NoFunction,
    /// The fprobe could not be registered.
    Fprobe(ustrace_fprobe::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NoFunction => f.write_str("no function to profile"),
            Error::Fprobe(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

struct State {
    /// The fprobe while the profiler is on.
    probe: Option<Fprobe>,
    /// The last profile: kept after the profiler is turned off, for reading.
    profile: Option<Arc<Profile>>,
}

static STATE: Mutex<State> = Mutex::new(State {
    probe: None,
    profile: None,
});

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the profiler is on (`function_profile_enabled`).
pub fn enabled() -> bool {
    state().probe.is_some()
}

/// The current (or last) profile.
pub fn current() -> Option<Arc<Profile>> {
    state().profile.clone()
}

/// Turns the profiler on over `funcs` (address, name), with fresh counters for `cpus` CPUs.
/// Does nothing when it is already on (as the kernel's write of 1 over 1). Functions that
/// cannot be patched are skipped (and never show); it fails only when none can be patched.
pub fn start(
    funcs: Vec<(usize, String)>,
    cpus: usize,
    graph_time: Arc<dyn Fn() -> bool + Send + Sync>,
) -> Result<(), Error> {
    let mut st = state();
    if st.probe.is_some() {
        return Ok(());
    }
    if funcs.is_empty() {
        return Err(Error::NoFunction);
    }
    // The TSC's scale, so the handlers read the clock without a system call.
    clock::init();
    let profile = Arc::new(Profile::new(funcs, cpus.max(1), graph_time));
    let probe = builder(&profile)
        .register_ips_lenient(&profile.addrs)
        .map_err(|e| match e {
            ustrace_fprobe::Error::NoMatch(_) | ustrace_fprobe::Error::Refused(_) => {
                Error::NoFunction
            }
            e => Error::Fprobe(e),
        })?;
    st.profile = Some(profile);
    st.probe = Some(probe);
    Ok(())
}

/// The fprobe of a profile: entry counts and stamps, exit adds the duration.
fn builder(profile: &Arc<Profile>) -> ustrace_fprobe::FprobeBuilder {
    let (on_entry, on_exit) = (profile.clone(), profile.clone());
    Fprobe::builder()
        .entry_handler(move |_, ip, _, _, data| on_entry.enter(ip, data))
        .exit_handler(move |_, _, _, _, data| on_exit.exit(data))
        .entry_data_size(24)
}

/// Turns the profiler off: when this returns no handler of it runs any more. The numbers
/// stay readable until the next [`start`].
pub fn stop() -> Result<(), Error> {
    let probe = state().probe.take();
    match probe {
        Some(p) => p.unregister().map_err(Error::Fprobe),
        None => Ok(()),
    }
}

/// Calls the profiler missed (recursion into a profiled function from a handler, a full
/// shadow stack): the fprobe's `nmissed`.
pub fn missed() -> u64 {
    state().probe.as_ref().map_or(0, |p| p.nmissed())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dur(ns: u64) -> String {
        let mut s = String::new();
        write_duration(&mut s, ns);
        s
    }

    #[test]
    fn durations_print_like_the_function_graph() {
        assert_eq!(dur(0), "0.000 us    ");
        assert_eq!(dur(1234), "1.234 us    ");
        assert_eq!(dur(12_345_678), "12345.67 us ");
        assert_eq!(dur(123_456_789), "123456.7 us ");
        assert_eq!(dur(1_234_567_890), "1234567 us  ");
    }

    #[test]
    fn variance_matches_the_kernel_formula() {
        // Three calls of 1, 2 and 3 µs: mean 2 µs, sample variance 1 µs² = 10^6 ns², which
        // the kernel divides by 1000 once before printing it as a duration (1.000 us).
        let s = Stat {
            name: "f".into(),
            addr: 1,
            hits: 3,
            time: 6000,
            time_sq: 1_000_000 + 4_000_000 + 9_000_000,
        };
        assert_eq!(s.avg(), 2000);
        assert_eq!(s.s2(), 1000);
        let text = format_stats(&[s], 0);
        assert_eq!(
            text.lines().nth(2).unwrap(),
            "  f                                        3    6.000 us        2.000 us        1.000 us    "
        );
    }

    #[test]
    fn names_are_cut_at_thirty_and_the_threshold_drops_fast_functions() {
        let long = Stat {
            name: "a_function_name_longer_than_thirty_chars".into(),
            addr: 1,
            hits: 1,
            time: 500,
            time_sq: 250_000,
        };
        let text = format_stats(std::slice::from_ref(&long), 0);
        assert!(text.contains("  a_function_name_longer_than_th           1"));
        assert_eq!(format_stats(&[long], 1000), HEADER);
    }
}
