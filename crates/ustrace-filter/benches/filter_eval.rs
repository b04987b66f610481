//! Cost of evaluating a filter on an event it rejects.
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use ustrace_filter::{compile, CompileEnv, Context, Field};

fn reject_three_predicates(c: &mut Criterion) {
    let fields = [
        Field {
            name: "id",
            c_type: "long",
            offset: 8,
            size: 8,
            signed: true,
        },
        Field {
            name: "args",
            c_type: "unsigned long[6]",
            offset: 16,
            size: 48,
            signed: false,
        },
    ];
    let env = CompileEnv {
        nr_cpus: 4,
        ..CompileEnv::default()
    };
    // The last predicate fails, so all three run.
    let prog = compile("common_pid > 0 && id >= 10 && id < 15", &fields, &env).unwrap();
    let mut rec = [0u8; 64];
    rec[4..8].copy_from_slice(&1234i32.to_ne_bytes());
    rec[8..16].copy_from_slice(&20i64.to_ne_bytes());
    let ctx = Context {
        cpu: 0,
        comm: b"bash",
        read_str: None,
    };
    assert!(!prog.matches(&rec, &ctx));
    c.bench_function("reject_3_predicates", |b| {
        b.iter(|| black_box(&prog).matches(black_box(&rec), black_box(&ctx)))
    });
}

criterion_group!(benches, reject_three_predicates);
criterion_main!(benches);
