//! A disabled static-key site against an empty loop body, in the same run.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use ustrace_fprobe::static_branch_unlikely;
use ustrace_fprobe::static_key::StaticKey;

static KEY: StaticKey = StaticKey::new();

#[inline(never)]
fn slow_path(x: u64) -> u64 {
    black_box(x) * 7
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("static_key");
    g.bench_function("empty_loop_body", |b| b.iter(|| black_box(1u64)));
    g.bench_function("disabled_site", |b| {
        b.iter(|| {
            let x = black_box(1u64);
            if static_branch_unlikely!(KEY) {
                slow_path(x)
            } else {
                x
            }
        })
    });
    g.bench_function("atomic_bool_check", |b| {
        b.iter(|| {
            let x = black_box(1u64);
            if KEY.is_enabled() {
                slow_path(x)
            } else {
                x
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
