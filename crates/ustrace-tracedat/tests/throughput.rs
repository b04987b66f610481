//! How fast the writer takes pages (the recorder's drain path), against `memcpy` of the
//! same bytes. Not a pass/fail test: run with
//! `cargo test --release -p ustrace-tracedat --test throughput -- --ignored --nocapture`.

use std::time::Instant;

use ustrace_ringbuf::page::PageWriter;
use ustrace_tracedat::{count_records, PageLayout, TraceMeta, Writer};

const HEADER_PAGE: &str = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\
\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\
\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n";

#[test]
#[ignore]
fn writer_pages_per_second() {
    // A realistic page: 32-byte records (a small event) back to back.
    let mut w = PageWriter::new(1);
    let mut ts = 1;
    while w.push(ts, &[0xab; 24]) {
        ts += 100;
    }
    let page = w.finish(None);
    let meta = TraceMeta {
        header_page: HEADER_PAGE.as_bytes().to_vec(),
        trace_clock: "local".into(),
        cpus: 2,
        page_size: 4096,
        ..TraceMeta::default()
    };
    let pages = 128 * 1024; // 512 MiB
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("throughput.dat");
    let start = Instant::now();
    let mut writer = Writer::create(&path, &meta).unwrap();
    for i in 0..pages {
        writer.push_page(i % 2, &page).unwrap();
    }
    let pushed = start.elapsed();
    writer.finish().unwrap();
    let total = start.elapsed();
    std::fs::remove_file(&path).unwrap();
    let mb = (pages * 4096) as f64 / 1e6;
    // memcpy of the same bytes into a reused 64 KiB buffer, as the writer's BufWriter does.
    let mut buf = vec![0u8; 1 << 16];
    let start = Instant::now();
    for i in 0..pages {
        let at = (i * 4096) % buf.len();
        buf[at..at + 4096].copy_from_slice(std::hint::black_box(&page));
    }
    std::hint::black_box(&buf);
    let copy = start.elapsed();
    let start = Instant::now();
    let mut n = 0;
    for _ in 0..pages {
        n += count_records(std::hint::black_box(&page), &PageLayout::DEFAULT).unwrap();
    }
    std::hint::black_box(n);
    let count = start.elapsed();
    println!(
        "push_page: {:.0} MB/s; with finish (headers + copying the scratch files): {:.0} MB/s; \
         memcpy: {:.0} MB/s; the page check alone: {:.0} MB/s",
        mb / pushed.as_secs_f64(),
        mb / total.as_secs_f64(),
        mb / copy.as_secs_f64(),
        mb / count.as_secs_f64()
    );
}
