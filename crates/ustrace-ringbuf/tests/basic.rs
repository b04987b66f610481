//! Single-threaded behaviour of the public API: what goes in comes out, in
//! order, with the kernel's accounting.

use std::time::Duration;
use ustrace_ringbuf::page::{PageDecoder, DATA_SIZE, PAGE_SIZE};
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer};

fn buf(name: &str, pages: usize, overwrite: bool) -> RingBuffer {
    RingBuffer::new(Config {
        nr_cpus: 1,
        size_per_cpu: pages * DATA_SIZE,
        overwrite,
        clock: Clock::Local,
        name: name.into(),
    })
    .unwrap()
}

fn ev(i: u32, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len.max(4)];
    v[..4].copy_from_slice(&i.to_le_bytes());
    for (k, b) in v.iter_mut().enumerate().skip(4) {
        *b = (i as usize + k) as u8;
    }
    v.truncate(len.max(4));
    v
}

#[test]
fn write_then_consume_in_order() {
    let rb = buf("basic", 4, true);
    for i in 0..100u32 {
        assert!(rb.write(&ev(i, 4 + (i as usize % 150))));
    }
    assert_eq!(rb.stats(0).entries, 100);
    assert_eq!(rb.iter().count(), 100, "iter is not consuming");
    let mut last = 0;
    for i in 0..100u32 {
        let e = rb.consume(0).expect("event");
        let want = ev(i, 4 + (i as usize % 150));
        assert_eq!(&e.data[..want.len()], &want[..]);
        assert!(e.data[want.len()..].iter().all(|&b| b == 0));
        assert!(e.ts >= last);
        last = e.ts;
        assert_eq!(e.lost_before, 0);
    }
    assert!(rb.consume(0).is_none());
    let s = rb.stats(0);
    assert_eq!(
        (s.entries, s.read_events, s.written, s.overrun),
        (0, 100, 100, 0)
    );
}

#[test]
fn overwrite_counts_overrun_and_reports_lost() {
    let rb = buf("ovw", 2, true);
    let n = 2000u32;
    for i in 0..n {
        assert!(rb.write(&ev(i, 40)));
    }
    let s = rb.stats(0);
    assert_eq!(s.entries + s.overrun, n as u64);
    assert!(s.overrun > 0);
    let first = rb.consume(0).unwrap();
    assert_eq!(first.lost_before, s.overrun);
    let first_id = u32::from_le_bytes(first.data[..4].try_into().unwrap());
    assert_eq!(
        first_id as u64, s.overrun,
        "the oldest surviving event follows the lost ones"
    );
    let mut count = 1;
    while rb.consume(0).is_some() {
        count += 1;
    }
    assert_eq!(count, s.entries);
    assert_eq!(rb.written(), s.overrun);
}

#[test]
fn producer_consumer_drops_new_events() {
    let rb = buf("pc", 2, false);
    let mut ok = 0u64;
    let mut failed = 0u64;
    for i in 0..2000u32 {
        if rb.write(&ev(i, 40)) {
            ok += 1;
        } else {
            failed += 1;
        }
    }
    let s = rb.stats(0);
    assert!(failed > 0);
    assert_eq!(s.dropped_events + s.commit_overrun, failed);
    assert_eq!(s.entries, ok);
    // The oldest events are kept.
    let first = rb.consume(0).unwrap();
    assert_eq!(u32::from_le_bytes(first.data[..4].try_into().unwrap()), 0);
    // After reading a page's worth, writing works again.
    while rb.consume(0).is_some() {}
    assert!(rb.write(&ev(9999, 40)));
}

#[test]
fn discard_and_drop_hide_events_and_keep_time() {
    let rb = buf("discard", 4, true);
    assert!(rb.write(b"keep"));
    let r = rb.reserve(16).unwrap();
    r.discard();
    {
        let _r = rb.reserve(100).unwrap(); // dropped without commit = discard
    }
    let mut r = rb.reserve(4).unwrap();
    r.copy_from_slice(b"also");
    r.commit();
    let evs: Vec<_> = rb.iter().collect();
    assert_eq!(evs.len(), 2);
    assert_eq!(&evs[0].data[..], b"keep");
    assert_eq!(&evs[1].data[..], b"also");
    assert_eq!(rb.stats(0).written, 2);
}

#[test]
fn recording_off_and_too_big() {
    let rb = buf("rec", 4, true);
    rb.set_recording(false);
    assert!(!rb.write(b"x"));
    rb.set_recording(true);
    assert!(rb.reserve(ustrace_ringbuf::MAX_PAYLOAD + 1).is_none());
    assert!(rb.write(&vec![7u8; ustrace_ringbuf::MAX_PAYLOAD]));
    let e = rb.consume(0).unwrap();
    assert_eq!(e.data.len(), ustrace_ringbuf::MAX_PAYLOAD);
}

#[test]
fn read_page_returns_kernel_pages() {
    let rb = buf("raw", 8, true);
    for i in 0..300u32 {
        rb.write(&ev(i, 24));
    }
    // Consume a few events first: the page reader returns the rest of that page.
    for _ in 0..3 {
        rb.consume(0).unwrap();
    }
    let mut next = 3u32;
    let mut pages = 0;
    while let Some(page) = rb.read_page(0) {
        assert_eq!(page.len(), PAGE_SIZE);
        pages += 1;
        let dec = PageDecoder::new(&page).unwrap();
        assert_eq!(dec.missed_events(), None);
        for e in dec {
            assert_eq!(u32::from_le_bytes(e.data[..4].try_into().unwrap()), next);
            next += 1;
        }
    }
    assert_eq!(next, 300);
    assert!(pages >= 2);
    assert_eq!(rb.stats(0).read_events, 300);
}

#[test]
fn read_page_flags_lost_events() {
    let rb = buf("rawlost", 2, true);
    for i in 0..1000u32 {
        rb.write(&ev(i, 24));
    }
    let overrun = rb.stats(0).overrun;
    let page = rb.read_page(0).unwrap();
    let dec = PageDecoder::new(&page).unwrap();
    assert_eq!(dec.missed_events(), Some(overrun));
}

#[test]
fn reset_clears_everything() {
    let rb = buf("reset", 2, true);
    for i in 0..1000u32 {
        rb.write(&ev(i, 24));
    }
    rb.reset();
    let s = rb.stats(0);
    assert_eq!(
        s,
        ustrace_ringbuf::CpuStats {
            now_ts: s.now_ts,
            ..Default::default()
        }
    );
    assert!(rb.consume(0).is_none());
    assert!(rb.write(b"new!"));
    assert_eq!(&rb.consume(0).unwrap().data[..], b"new!");
}

#[test]
fn resize_keeps_unread_events() {
    let rb = buf("resize", 2, true);
    for i in 0..10u32 {
        rb.write(&ev(i, 24));
    }
    rb.resize(10 * DATA_SIZE).unwrap();
    assert_eq!(rb.size_per_cpu(), 10 * DATA_SIZE);
    for i in 10..20u32 {
        rb.write(&ev(i, 24));
    }
    let ids: Vec<u32> = rb
        .iter()
        .map(|e| u32::from_le_bytes(e.data[..4].try_into().unwrap()))
        .collect();
    assert_eq!(ids, (0..20).collect::<Vec<_>>());
    for i in 0..20u32 {
        let e = rb.consume(0).unwrap();
        assert_eq!(u32::from_le_bytes(e.data[..4].try_into().unwrap()), i);
    }
    let s = rb.stats(0);
    assert_eq!((s.written, s.read_events, s.entries), (20, 20, 0));
    rb.resize(3000).unwrap();
    assert_eq!(rb.size_per_cpu(), 2 * DATA_SIZE, "at least two pages");
}

#[test]
fn swap_exchanges_contents() {
    let a = buf("swapa", 4, true);
    let b = buf("swapb", 4, true);
    a.write(b"aaaa");
    b.write(b"bbbb");
    b.write(b"bbb2");
    a.swap(&b).unwrap();
    assert_eq!(a.iter().count(), 2);
    assert_eq!(&b.consume(0).unwrap().data[..], b"aaaa");
    a.write(b"new!");
    assert_eq!(a.iter().count(), 3);
    let c = buf("swapc", 8, true);
    assert!(a.swap(&c).is_err());
    assert!(a.swap(&a).is_err());
}

#[test]
fn clock_change_resets_and_stamps_with_new_clock() {
    let rb = buf("clock", 4, true);
    rb.write(b"old!");
    rb.set_clock(Clock::Counter);
    assert_eq!(rb.clock(), Clock::Counter);
    assert!(rb.consume(0).is_none());
    rb.write(b"one!");
    rb.write(b"two!");
    let a = rb.consume(0).unwrap();
    let b = rb.consume(0).unwrap();
    assert!(
        b.ts > a.ts && b.ts - a.ts < 1000,
        "counter stamps: {} then {}",
        a.ts,
        b.ts
    );
}

/// The owner's fast path handles recording with the `local` clock only:
/// a clock change and `tracing_on` must take writers off it and back on,
/// on every CPU (a buffer per CPU, so whichever CPU the test runs on has
/// one and writes as its owner).
#[test]
fn fast_path_follows_clock_and_recording() {
    let rb = RingBuffer::new(Config {
        nr_cpus: ustrace_ringbuf::cpu::possible_cpus(),
        size_per_cpu: 4 * DATA_SIZE,
        overwrite: true,
        clock: Clock::Local,
        name: "fastpath".into(),
    })
    .unwrap();
    // A stamp of the global counter is small; one of `local` is
    // nanoseconds of TSC time, which any machine has run for a second of.
    let counter_like = |ts: u64| ts < 1_000_000_000;
    for round in 0..2 {
        rb.set_clock(Clock::Counter);
        for _ in 0..3 {
            assert!(rb.write(b"cntr"));
        }
        let mut n = 0;
        while let Some(e) = rb.consume_any() {
            assert!(counter_like(e.ts), "round {round}: counter stamp {}", e.ts);
            n += 1;
        }
        assert_eq!(n, 3, "round {round}");
        rb.set_clock(Clock::Local);
        for _ in 0..3 {
            assert!(rb.write(b"locl"));
        }
        let mut n = 0;
        while let Some(e) = rb.consume_any() {
            assert!(!counter_like(e.ts), "round {round}: local stamp {}", e.ts);
            n += 1;
        }
        assert_eq!(n, 3, "round {round}");
    }
    // x86-tsc counts cycles, more than `local`'s nanoseconds: a writer
    // wrongly on the fast path would take max(local, last) = last, and
    // stamp every event after a page's first with that page's first stamp.
    rb.set_clock(Clock::X86Tsc);
    for _ in 0..3 {
        assert!(rb.write(b"tsc!"));
    }
    let stamps: Vec<u64> = std::iter::from_fn(|| rb.consume_any().map(|e| e.ts)).collect();
    assert_eq!(stamps.len(), 3);
    assert!(
        stamps.windows(2).all(|w| w[1] > w[0]),
        "x86-tsc stamps do not advance: {stamps:?}"
    );
    rb.set_clock(Clock::Local);
    rb.set_recording(false);
    assert!(!rb.write(b"off!"));
    assert!(rb.consume_any().is_none());
    rb.set_recording(true);
    assert!(rb.write(b"on!!"));
    assert_eq!(rb.consume_any().map(|e| e.ts > 0), Some(true));
    assert!(rb.consume_any().is_none());
}

#[test]
fn wait_times_out_then_wakes() {
    let rb = std::sync::Arc::new(buf("wait", 4, true));
    assert!(!rb.wait(Some(0), Some(Duration::from_millis(20))));
    let rb2 = rb.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        rb2.write(b"ping");
    });
    let start = std::time::Instant::now();
    assert!(rb.wait(None, Some(Duration::from_secs(5))));
    assert!(start.elapsed() < Duration::from_secs(2));
    t.join().unwrap();
    assert!(rb.wait(Some(0), Some(Duration::ZERO)));
}

#[test]
fn consume_any_merges_by_time() {
    let rb = RingBuffer::new(Config {
        nr_cpus: 2,
        size_per_cpu: 4 * DATA_SIZE,
        overwrite: true,
        clock: Clock::Counter,
        name: "any".into(),
    })
    .unwrap();
    for i in 0..50u32 {
        rb.write(&ev(i, 8));
    }
    let mut last = 0;
    for _ in 0..50 {
        let e = rb.consume_any().unwrap();
        assert!(e.ts > last);
        last = e.ts;
    }
    assert!(rb.consume_any().is_none());
}

#[test]
fn big_time_gaps_use_time_extends() {
    let rb = buf("extend", 4, true);
    rb.write(b"tick");
    std::thread::sleep(Duration::from_millis(150)); // > 2^27 ns
    rb.write(b"tock");
    let evs: Vec<_> = rb.iter().collect();
    assert_eq!(evs.len(), 2);
    let gap = evs[1].ts - evs[0].ts;
    assert!(gap >= 140_000_000, "gap {gap}");
    let page = rb.read_page(0).unwrap();
    let evs2: Vec<_> = PageDecoder::new(&page).unwrap().map(|e| e.ts).collect();
    assert_eq!(evs2, vec![evs[0].ts, evs[1].ts]);
}

/// Mixed writes, consumes and page reads in producer/consumer mode: the
/// entry count always matches, and everything written can be drained.
#[test]
fn producer_consumer_accounting_over_cycles() {
    let rb = RingBuffer::new(Config {
        nr_cpus: 1,
        size_per_cpu: 3 * DATA_SIZE,
        overwrite: false,
        clock: Clock::Local,
        name: "cycles".into(),
    })
    .unwrap();
    let mut ok = 0u64;
    let mut read = 0u64;
    for round in 0..50 {
        for i in 0..(round * 37 % 300 + 1) {
            if rb.write(&vec![i as u8; 24 + (i * 7 + round) % 200]) {
                ok += 1;
            }
        }
        let k = round * 13 % 200;
        for _ in 0..k {
            if rb.consume(0).is_some() {
                read += 1;
            }
        }
        if round.is_multiple_of(3) {
            while let Some(p) = rb.read_page(0) {
                read += ustrace_ringbuf::page::PageDecoder::new(&p).unwrap().count() as u64;
            }
        }
        let s = rb.stats(0);
        assert_eq!(s.entries, ok - read, "round {round}: {s:?}");
    }
    while rb.consume(0).is_some() {
        read += 1;
    }
    let s = rb.stats(0);
    assert_eq!(s.entries, 0, "{s:?} ok {ok} read {read}");
}

/// Many laps around a default-sized ring from one thread: no reservation
/// fails and the counters stay exact (a compare-and-swap reporting a wrong
/// result would lose pages here).
#[test]
fn many_laps_keep_exact_counts() {
    let rb = RingBuffer::new(Config {
        nr_cpus: 1,
        size_per_cpu: 1408 * 1024,
        overwrite: true,
        clock: Clock::Local,
        name: "laps".into(),
    })
    .unwrap();
    let n = 150_000u64;
    for i in 0..n {
        let mut r = rb
            .reserve(32)
            .unwrap_or_else(|| panic!("reserve {i} failed: {:?}", rb.stats(0)));
        r[..8].copy_from_slice(&i.to_ne_bytes());
        r.commit();
    }
    let s = rb.stats(0);
    assert_eq!(s.written, n);
    assert_eq!(s.entries + s.overrun, n);
    assert_eq!(s.commit_overrun, 0);
    let first = rb.consume(0).unwrap();
    assert_eq!(
        u64::from_ne_bytes(first.data[..8].try_into().unwrap()),
        s.overrun
    );
}

#[test]
fn an_event_too_big_for_a_page_is_counted_as_dropped_and_recording_off_is_not() {
    use ustrace_ringbuf::MAX_PAYLOAD;
    let rb = buf("oversize", 4, true);
    let dropped = |rb: &RingBuffer| {
        (0..rb.nr_cpus())
            .map(|c| rb.stats(c).dropped_events)
            .sum::<u64>()
    };
    assert!(rb.write(&vec![7u8; MAX_PAYLOAD]), "the largest event fits");
    assert!(!rb.write(&vec![7u8; MAX_PAYLOAD + 1]));
    assert_eq!(dropped(&rb), 1);
    rb.set_recording(false);
    assert!(!rb.write(&[1, 2, 3, 4]));
    assert!(!rb.write(&vec![7u8; MAX_PAYLOAD + 1]));
    assert_eq!(dropped(&rb), 1, "nothing is lost while recording is off");
    rb.set_recording(true);
    let e = rb.consume(0).expect("the largest event");
    assert_eq!(e.data.len(), MAX_PAYLOAD);
}

/// `Reservation::timestamp` is the time readers see on that event, on
/// every path a reservation takes: the first event of a page, events inside
/// it (the owner's fast path where it runs), a time extend after a long
/// gap, and another clock (the slow path).
#[test]
fn a_reservation_knows_the_time_its_event_carries() {
    let rb = buf("stamped", 4, true);
    let write = |rb: &RingBuffer, n: u32, gap_after: Option<u32>| -> Vec<u64> {
        let mut stamps = Vec::new();
        for i in 0..n {
            let mut r = rb.reserve(24).expect("reserve");
            r[..4].copy_from_slice(&i.to_le_bytes());
            stamps.push(r.timestamp());
            r.commit();
            if gap_after == Some(i) {
                std::thread::sleep(Duration::from_millis(150)); // > 2^27 ns
            }
        }
        stamps
    };
    // 300 events of 32 bytes cross two page boundaries.
    let stamps = write(&rb, 300, Some(200));
    let seen: Vec<u64> = rb.iter().map(|e| e.ts).collect();
    assert_eq!(seen, stamps);
    assert!(stamps[201] - stamps[200] >= 140_000_000);
    rb.set_clock(Clock::Counter);
    let stamps = write(&rb, 9, None);
    let seen: Vec<u64> = rb.iter().map(|e| e.ts).collect();
    assert_eq!(seen, stamps);
}
