//! The timing and checking every `ustrace bench` run shares: the hot-path figures
//! ([`crate::bench`]), the peers ([`crate::bench_peers`]) and the cost curves
//! ([`crate::bench_scale`]) all time loops here, check what the loops recorded, and set
//! tracefs files through the in-process tree.

use std::time::Instant;

use ustrace::{FileSystem, OpenFlags};
use ustrace_ringbuf::RingBuffer;

/// What every kind of run takes from the command line.
pub(crate) struct Settings {
    /// One JSON object per line instead of a table.
    pub(crate) json: bool,
    /// A Markdown table (`--peers` only).
    pub(crate) markdown: bool,
    /// Operations per timed repetition.
    pub(crate) iterations: u64,
    /// Repetitions per figure (the median is reported).
    pub(crate) repetitions: usize,
}

pub(crate) fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

/// A timed loop's result: the median ns per iteration, and how many iterations ran in all
/// (warm-up included), which is what the loop's effects are checked against.
pub(crate) struct Timing {
    pub(crate) ns_per_op: f64,
    pub(crate) ops: u64,
}

/// Times `body(iterations)` `reps` times, after one shorter warm-up run (caches, buffer
/// pages). `body` fails when an operation did not complete.
pub(crate) fn time_per_op(
    iterations: u64,
    reps: usize,
    mut body: impl FnMut(u64) -> Result<(), String>,
) -> Result<Timing, String> {
    let warm = iterations / 10 + 1;
    body(warm)?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        body(iterations)?;
        samples.push(start.elapsed().as_nanos() as f64 / iterations as f64);
    }
    Ok(Timing {
        ns_per_op: median(samples),
        ops: warm + iterations * reps as u64,
    })
}

/// [`time_per_op`] while `fp` is attached; then unregisters it and checks that no probed
/// call missed its handlers (a figure for calls the probe skipped would be too low).
/// Errors start with `what`.
pub(crate) fn time_probed(
    what: &str,
    fp: ustrace_fprobe::Fprobe,
    iterations: u64,
    reps: usize,
    body: impl FnMut(u64) -> Result<(), String>,
) -> Result<Timing, String> {
    let timing = time_per_op(iterations, reps, body);
    let missed = fp.nmissed();
    fp.unregister()
        .map_err(|e| format!("{what}: unregister: {e}"))?;
    let timing = timing?;
    if missed != 0 {
        return Err(format!(
            "{what}: {missed} of {} probed calls missed their handlers",
            timing.ops
        ));
    }
    Ok(timing)
}

/// A loop that cannot fail, for [`time_per_op`].
pub(crate) fn infallible(body: impl Fn(u64)) -> impl FnMut(u64) -> Result<(), String> {
    move |n| {
        body(n);
        Ok(())
    }
}

/// Events a buffer has recorded, and events it lost (dropped, or overrun while committing),
/// over all its CPUs.
pub(crate) fn tally(buffer: &RingBuffer) -> (u64, u64) {
    (0..buffer.nr_cpus())
        .map(|cpu| buffer.stats(cpu))
        .fold((0, 0), |(written, lost), s| {
            (
                written + s.written,
                lost + s.dropped_events + s.commit_overrun,
            )
        })
}

/// [`time_per_op`], then a check that `buffer` recorded exactly `per_op` events for each
/// operation and lost none.
pub(crate) fn time_recorded(
    name: &str,
    buffer: &RingBuffer,
    per_op: u64,
    iterations: u64,
    reps: usize,
    body: impl FnMut(u64) -> Result<(), String>,
) -> Result<f64, String> {
    let before = tally(buffer);
    let timing = time_per_op(iterations, reps, body)?;
    let after = tally(buffer);
    let (written, lost) = (after.0 - before.0, after.1 - before.1);
    if lost != 0 {
        return Err(format!(
            "{name}: the buffer lost {lost} events in {} operations",
            timing.ops
        ));
    }
    if written != per_op * timing.ops {
        return Err(format!(
            "{name}: {written} events recorded for {} operations, expected {}",
            timing.ops,
            per_op * timing.ops
        ));
    }
    Ok(timing.ns_per_op)
}

pub(crate) fn append(path: &str, text: &str) -> Result<(), String> {
    let mut file = ustrace::tracefs()
        .open(path, OpenFlags::APPEND)
        .map_err(|e| format!("open {path}: {e}"))?;
    file.write(text.as_bytes())
        .map_err(|e| format!("write {path}: {e}"))?;
    Ok(())
}

pub(crate) fn set(path: &str, text: &str) -> Result<(), String> {
    let mut file = ustrace::tracefs()
        .open(path, OpenFlags::TRUNCATE)
        .map_err(|e| format!("open {path}: {e}"))?;
    file.write(text.as_bytes())
        .map_err(|e| format!("write {path}: {e}"))?;
    Ok(())
}

pub(crate) fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}
