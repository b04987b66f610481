//! The `synth_onmatch_pair` figure of `ustrace bench`: what an inter-event latency costs.
//!
//! Two events matched by a key, as a request and its response: the first saves its time
//! stamp in a hist variable (`hist:keys=key:t0=common_timestamp`), the second computes the
//! latency from it and generates a synthetic event with `onmatch().trace()`, which is
//! recorded. One operation is the pair of calls; the check after the loop is that every
//! pair recorded exactly one synthetic event and nothing was lost.
//!
//! Both triggers say `clock=local`, the default trace clock: without it a `common_timestamp`
//! switches the instance to the `global` clock, as the kernel does, and every time stamp
//! (two in the triggers, one in the synthetic record) becomes a `clock_gettime` call, which
//! measured about a quarter of the pair's time here.

use std::hint::black_box;

use ustrace::trace::tracing;

use crate::bench_measure::{append, set, time_recorded};

ustrace::trace_event! {
    /// The first event of a pair: its time stamp is saved per key.
    fn ustrace_bench::pair_start(key: u64) {
        key: u64 = key,
    }
    print "key=%llu", key;
}

ustrace::trace_event! {
    /// The second event of a pair: latency from the first, then the synthetic event.
    fn ustrace_bench::pair_end(key: u64) {
        key: u64 = key,
    }
    print "key=%llu", key;
}

/// Keys cycle over this many values, well inside the default 2048-entry table.
const KEYS: u64 = 1024;

#[inline(never)]
fn pair_loop(n: u64) {
    for i in 0..n {
        let k = black_box(i) & (KEYS - 1);
        pair_start::trace(k);
        pair_end::trace(k);
    }
}

/// Times one pair (ns per pair), in an instance of its own that is removed afterwards,
/// with the synthetic event defined for the run only.
pub(crate) fn synth_onmatch_pair(n: u64, reps: usize) -> Result<f64, String> {
    let instance = "ustrace-bench-inter";
    let _ = tracing().remove_instance(instance);
    tracing()
        .create_instance(instance)
        .map_err(|e| format!("mkdir instances/{instance}: {e}"))?;
    let path = |p: &str| format!("instances/{instance}/{p}");
    let start = "hist:keys=key:t0=common_timestamp:clock=local";
    let end = "hist:keys=key:lat=common_timestamp-$t0:clock=local:onmatch(ustrace_bench.pair_start).trace(bench_pair_lat,key,$lat)";
    let timed = (|| {
        append("synthetic_events", "bench_pair_lat u64 key; u64 lat\n")?;
        set(&path("buffer_size_kb"), "4096\n")?;
        set(
            &path("events/ustrace_bench/pair_start/trigger"),
            &format!("{start}\n"),
        )?;
        set(
            &path("events/ustrace_bench/pair_end/trigger"),
            &format!("{end}\n"),
        )
        .map_err(|e| {
            let log = tracing()
                .instance(instance)
                .map(|i| i.error_log_text())
                .unwrap_or_default();
            format!("{e}\n{log}")
        })?;
        set(&path("events/synthetic/bench_pair_lat/enable"), "1\n")?;
        let inst = tracing()
            .instance(instance)
            .ok_or("bench instance vanished")?;
        time_recorded("synth_onmatch_pair", inst.buffer(), 1, n, reps, |k| {
            pair_loop(k);
            Ok(())
        })
    })();
    // Undo in reverse, whatever failed: the referencing trigger before the referenced one,
    // both before the synthetic event they hold.
    let _ = set(&path("events/synthetic/bench_pair_lat/enable"), "0\n");
    let _ = append(
        &path("events/ustrace_bench/pair_end/trigger"),
        &format!("!{end}\n"),
    );
    let _ = append(
        &path("events/ustrace_bench/pair_start/trigger"),
        &format!("!{start}\n"),
    );
    let removed = tracing().remove_instance(instance);
    let _ = append("synthetic_events", "!bench_pair_lat\n");
    let ns = timed?;
    removed.map_err(|e| format!("rmdir instances/{instance}: {e}"))?;
    Ok(ns)
}
