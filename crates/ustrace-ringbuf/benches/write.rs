//! Write-path cost: reserve + fill + commit of a 32-byte event.
//!
//! * `reserve_commit_32b/one_thread` — one thread (target <= 15 ns).
//! * `reserve_commit_32b/two_threads_two_cores` — two threads pinned to two
//!   cores, each writing `iters` events; the reported time is per event per
//!   thread, so throughput scaling = 2 × one_thread / two_threads
//!   (target >= 1.7).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer};

fn buffer() -> RingBuffer {
    RingBuffer::new(Config {
        nr_cpus: ustrace_ringbuf::cpu::possible_cpus(),
        size_per_cpu: 1408 * 1024,
        overwrite: true,
        clock: Clock::Local,
        name: "bench".into(),
    })
    .expect("ring buffer")
}

#[inline]
fn write_one(rb: &RingBuffer, i: u64) {
    let Some(mut r) = rb.reserve(32) else {
        let stats: Vec<_> = (0..rb.nr_cpus()).map(|c| rb.stats(c)).collect();
        panic!("reserve failed in overwrite mode: {stats:?}");
    };
    r[..8].copy_from_slice(&i.to_ne_bytes());
    r.commit();
}

fn pin(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is valid; we set one bit and apply it to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

fn online_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid out-parameter.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: querying this thread's affinity into `set`.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0
    {
        return vec![0];
    }
    // SAFETY: CPU_ISSET only reads `set`.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

fn bench(c: &mut Criterion) {
    let rb = Arc::new(buffer());
    let cpus = online_cpus();
    let mut g = c.benchmark_group("reserve_commit_32b");
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(1));
    g.bench_function("one_thread", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            write_one(&rb, i)
        })
    });
    if cpus.len() >= 2 {
        g.throughput(Throughput::Elements(2));
        g.bench_function("two_threads_two_cores", |b| {
            b.iter_custom(|iters| {
                let barrier = Arc::new(Barrier::new(2));
                let workers: Vec<_> = cpus[..2]
                    .iter()
                    .map(|&cpu| {
                        let (rb, barrier) = (rb.clone(), barrier.clone());
                        std::thread::spawn(move || {
                            pin(cpu);
                            barrier.wait();
                            let t = Instant::now();
                            for i in 0..iters {
                                write_one(&rb, i);
                            }
                            t.elapsed()
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|w| w.join().unwrap())
                    .max()
                    .unwrap()
            })
        });
    } else {
        eprintln!("skipped: two_threads_two_cores needs two usable cpus");
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
