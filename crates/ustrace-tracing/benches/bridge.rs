//! A `tracing::info!` with three integer fields through the ustrace layer, beside `tracing`'s
//! null subscriber and its fmt layer (issue 17's comparison; `ustrace bench --filter
//! 'tracing*'` gives the same figures with their checks):
//!
//! - `tracing_event_off/no_subscriber`: no subscriber installed, so the default dispatcher
//!   is `tracing`'s null subscriber (`NoSubscriber`) and the callsite is disabled: the floor
//!   of `tracing_event_off/ustrace_layer` (the layer installed, the event off).
//! - `tracing_event_3fields/ustrace_layer`: the event enabled in an instance, recorded.
//! - `tracing_event_3fields/null_subscriber`: a subscriber that is interested in every
//!   callsite and does nothing with the event: what `tracing`'s dispatch costs by itself,
//!   the part of `ustrace_layer` that is not ours. It is a scoped dispatcher
//!   (`with_default`), which `tracing` finds through a thread local: a little dearer than
//!   the global default the layer is measured under.
//! - `tracing_event_3fields/fmt_layer_sink`: `tracing-subscriber`'s fmt layer writing the
//!   same event into `std::io::sink`.
//!
//! One function runs every case in order, because the first needs a process where no
//! subscriber was ever installed and the ustrace layer then stays the global default.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use tracing_subscriber::layer::SubscriberExt;
use ustrace::{FileSystem, OpenFlags};

fn set(path: &str, text: &str) {
    let mut f = ustrace::tracefs().open(path, OpenFlags::TRUNCATE).unwrap();
    f.write(text.as_bytes()).unwrap();
}

#[inline(always)]
fn fields3(i: u64) {
    tracing::info!(name: "fields3", a = i, b = 2u64, c = 3u64);
}

/// The same event at a callsite of its own, for the scoped dispatchers, so they do not
/// change the interest of the callsite the layer is measured on.
#[inline(always)]
fn fields3_other(i: u64) {
    tracing::info!(name: "fields3", a = i, b = 2u64, c = 3u64);
}

/// A null subscriber that, unlike `NoSubscriber`, is interested in everything: it sees each
/// event and drops it.
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

fn bridge(c: &mut Criterion) {
    let mut i = 0u64;
    let mut off = c.benchmark_group("tracing_event_off");
    off.bench_function("no_subscriber", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            fields3(black_box(i));
        })
    });
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(ustrace_tracing::layer()),
    )
    .unwrap();
    off.bench_function("ustrace_layer", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            fields3(black_box(i));
        })
    });
    off.finish();

    let mut on = c.benchmark_group("tracing_event_3fields");
    // Registers the callsite when the group above was filtered out (it records nothing).
    fields3(0);
    ustrace::tracefs().mkdir("instances/bench_bridge").unwrap();
    set("instances/bench_bridge/buffer_size_kb", "4096");
    set("instances/bench_bridge/events/bridge/fields3/enable", "1");
    on.bench_function("ustrace_layer", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            fields3(black_box(i));
        })
    });
    set("instances/bench_bridge/events/bridge/fields3/enable", "0");
    tracing::subscriber::with_default(Nothing, || {
        on.bench_function("null_subscriber", |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                fields3_other(black_box(i));
            })
        });
    });
    let fmt = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::with_default(fmt, || {
        on.bench_function("fmt_layer_sink", |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                fields3_other(black_box(i));
            })
        });
    });
    on.finish();
    ustrace::tracefs().rmdir("instances/bench_bridge").unwrap();
}

criterion_group!(benches, bridge);
criterion_main!(benches);
