//! An event with three integer fields, off and on, in ustrace and in the `tracing` crate.
//!
//! - off: ustrace's tracepoint with no probe (a patched NOP) vs `tracing::event!` with no
//!   subscriber interested;
//! - on: ustrace recording into an instance's ring buffer vs `tracing` with a subscriber that
//!   does nothing, and with the fmt layer writing to a sink.
//!
//! Each group has its uninstrumented loop body as a baseline beside it.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use ustrace::{FileSystem, OpenFlags};

ustrace::trace_event! {
    pub fn bench_vs::ints3(a: u64, b: u64, c: u64) {
        a: u64 = a,
        b: u64 = b,
        c: u64 = c,
    }
    print "a=%llu b=%llu c=%llu", a, b, c;
}

fn set(path: &str, text: &str) {
    let mut f = ustrace::tracefs().open(path, OpenFlags::TRUNCATE).unwrap();
    f.write(text.as_bytes()).unwrap();
}

/// A subscriber that is interested in everything and does nothing.
struct Nothing;

impl tracing::Subscriber for Nothing {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        black_box(event);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn off(c: &mut Criterion) {
    let mut g = c.benchmark_group("event_off");
    let mut i = 0u64;
    g.bench_function("baseline", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(i)
        })
    });
    g.bench_function("ustrace", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            ints3::trace(i, 2, 3);
            black_box(i)
        })
    });
    g.bench_function("tracing", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            tracing::info!(a = i, b = 2u64, c = 3u64, "ints3");
            black_box(i)
        })
    });
    g.finish();
}

fn on(c: &mut Criterion) {
    let mut g = c.benchmark_group("event_on");
    let mut i = 0u64;
    // The same loop body without the event, as in `event_off`: what every `event_on`
    // figure is read against.
    g.bench_function("baseline", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(i)
        })
    });
    let _ = ustrace::tracefs().mkdir("instances/vs-tracing");
    set("instances/vs-tracing/events/bench_vs/ints3/enable", "1\n");
    g.bench_function("ustrace", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            ints3::trace(i, 2, 3);
            black_box(i)
        })
    });
    set("instances/vs-tracing/events/bench_vs/ints3/enable", "0\n");
    tracing::subscriber::with_default(Nothing, || {
        g.bench_function("tracing_nop_subscriber", |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                tracing::info!(a = i, b = 2u64, c = 3u64, "ints3");
                black_box(i)
            })
        });
    });
    let fmt = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::with_default(fmt, || {
        g.bench_function("tracing_fmt_to_sink", |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                tracing::info!(a = i, b = 2u64, c = 3u64, "ints3");
                black_box(i)
            })
        });
    });
    g.finish();
}

criterion_group!(benches, off, on);
criterion_main!(benches);
