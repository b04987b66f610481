//! A buffer size the system cannot back fails with `OutOfMemory` before
//! anything is made: no file, no mapping, and the buffer keeps its size and
//! its events. A file of its own, so that nothing else in the process maps
//! or opens files while it counts them.

use std::io::ErrorKind;
use ustrace_ringbuf::page::DATA_SIZE;
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer};

fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("read /proc/self/maps")
        .lines()
        .count()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

fn config(size_per_cpu: usize) -> Config {
    Config {
        nr_cpus: 2,
        size_per_cpu,
        overwrite: true,
        clock: Clock::Local,
        name: "size-limit".into(),
    }
}

#[test]
fn a_size_that_cannot_be_backed_fails_before_anything_is_mapped() {
    let rb = RingBuffer::new(config(16 * DATA_SIZE)).unwrap();
    for i in 0..100u32 {
        assert!(rb.write(&i.to_le_bytes()));
    }
    let (maps, fds) = (mappings(), open_fds());
    // 2 GiB per cpu (above the ceiling), 1 TiB, and what `buffer_size_kb`
    // 4294967296 asks for (4 TiB): the first was accepted before there was
    // a limit, and committed memory for its slot map.
    for size in [2usize << 30, 1 << 40, 4294967296 * 1024, usize::MAX] {
        let e = rb.resize(size).expect_err("an oversized resize must fail");
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{size}: {e}");
        let e = rb
            .resize_cpu(1, size)
            .expect_err("an oversized resize must fail");
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{size}: {e}");
        let e = RingBuffer::new(config(size))
            .err()
            .expect("an oversized buffer must fail");
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{size}: {e}");
    }
    assert_eq!(
        (mappings(), open_fds()),
        (maps, fds),
        "nothing mapped or opened"
    );
    assert_eq!(rb.size_of_cpu(0), 16 * DATA_SIZE);
    assert_eq!(rb.size_of_cpu(1), 16 * DATA_SIZE);
    assert_eq!(rb.iter().count(), 100, "the events are still there");

    // The ceiling itself is a valid size, and so is anything the machine
    // can back below it (here a quarter of it).
    const { assert!(ustrace_ringbuf::MAX_SIZE_PER_CPU >= 1 << 30) };
    rb.resize_cpu(1, ustrace_ringbuf::MAX_SIZE_PER_CPU / 4)
        .unwrap();
    assert_eq!(
        rb.size_of_cpu(1).div_ceil(DATA_SIZE),
        (ustrace_ringbuf::MAX_SIZE_PER_CPU / 4).div_ceil(DATA_SIZE)
    );
}
