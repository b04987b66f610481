//! Property tests: pages written by ustrace-ringbuf's page writer decode back to the same
//! events (timestamps across time extends and discarded records, payloads, loss marks),
//! and pages of several CPUs written to a trace.dat come back merged by time.

use proptest::prelude::*;
use ustrace_ringbuf::page::{PageDecoder, PageWriter, DATA_SIZE};
use ustrace_tracedat::{decode_page, PageLayout, Reader, TraceMeta, Writer};

const HEADER_PAGE: &str = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\
\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\
\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n";

#[derive(Clone, Debug)]
struct Ev {
    gap: u64,
    payload: Vec<u8>,
    discard_before: bool,
}

fn ev() -> impl Strategy<Value = Ev> {
    (
        prop_oneof![0u64..4, 0u64..(1 << 27), (1u64 << 27)..(1 << 40)],
        prop::collection::vec(any::<u8>(), 1..300),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(gap, payload, discard_before)| Ev {
            gap,
            payload,
            discard_before,
        })
}

/// A page and the (timestamp, payload) of each event it holds.
type Page = (Vec<u8>, Vec<(u64, Vec<u8>)>);

/// Fills pages with `evs` as the ring buffer would.
fn pages_of(base: u64, evs: &[Ev]) -> Vec<Page> {
    let mut out = Vec::new();
    let mut ts = base;
    let mut w = PageWriter::new(ts);
    let mut expect = Vec::new();
    for e in evs {
        ts += e.gap;
        if e.discard_before && w.push_discarded(ts, 12) {
            // The discarded record's delta moves the clock to at least ts + 1 for the
            // next event unless it carried a time extend; keep ours in step.
            ts += 1;
        }
        if !w.push(ts, &e.payload) {
            out.push((
                std::mem::replace(&mut w, PageWriter::new(ts)).finish(None),
                expect,
            ));
            expect = Vec::new();
            assert!(w.push(ts, &e.payload));
        }
        expect.push((ts, e.payload.clone()));
    }
    if !w.is_empty() {
        out.push((w.finish(None), expect));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn pages_decode_to_what_was_written(base in 0u64..(1 << 50), evs in prop::collection::vec(ev(), 1..200)) {
        for (page, expect) in pages_of(base, &evs) {
            let d = decode_page(&page, &PageLayout::DEFAULT).unwrap();
            // The ring buffer's own decoder says how long each record's payload is (the
            // writer pads it as the kernel does).
            let reference: Vec<_> = PageDecoder::new(&page).unwrap().collect();
            prop_assert_eq!(d.records.len(), expect.len());
            prop_assert_eq!(reference.len(), expect.len());
            for ((rec, (ts, payload)), r) in d.records.iter().zip(&expect).zip(&reference) {
                prop_assert_eq!(rec.ts, *ts);
                prop_assert_eq!(rec.len, r.data.len());
                prop_assert!(rec.len >= payload.len());
                prop_assert_eq!(&page[rec.start..rec.start + payload.len()], &payload[..]);
            }
        }
    }

    #[test]
    fn a_loss_mark_decodes_with_its_count(n in 0u64..1_000_000, room in any::<bool>()) {
        // A full page has no room for the count: the kernel flags the loss without it.
        let len = if room { 4 } else { DATA_SIZE - 8 };
        let mut w = PageWriter::new(5);
        assert!(w.push(6, &vec![1u8; len]));
        let d = decode_page(&w.finish(Some(n)), &PageLayout::DEFAULT).unwrap();
        prop_assert_eq!(d.records.len(), 1);
        if room {
            prop_assert_eq!((d.missed, d.missed_unknown), (Some(n), false));
        } else {
            prop_assert_eq!((d.missed, d.missed_unknown), (None, true));
        }
    }

    #[test]
    fn a_file_gives_back_every_cpu_merged_by_time(
        per_cpu in prop::collection::vec(prop::collection::vec(ev(), 0..120), 1..4),
    ) {
        let meta = TraceMeta {
            header_page: HEADER_PAGE.as_bytes().to_vec(),
            header_event: b"# compressed entry header\n".to_vec(),
            trace_clock: "local".into(),
            cpus: per_cpu.len(),
            page_size: 4096,
            ..TraceMeta::default()
        };
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let path = dir.join(format!("props-{}.dat", std::process::id()));
        let mut w = Writer::create(&path, &meta).unwrap();
        let mut expect = Vec::new();
        for (cpu, evs) in per_cpu.iter().enumerate() {
            for (page, events) in pages_of(1000, evs) {
                w.push_page(cpu, &page).unwrap();
                expect.extend(events.into_iter().map(|(ts, p)| (ts, cpu as u32, p)));
            }
        }
        w.finish().unwrap();
        // Stable: within a CPU, file order; across CPUs on a tie, the lower CPU first.
        expect.sort_by_key(|(ts, cpu, _)| (*ts, *cpu));
        let r = Reader::open(&path).unwrap();
        let got: Vec<_> = r.events().map(Result::unwrap).collect();
        prop_assert_eq!(got.len(), expect.len());
        for (e, (ts, cpu, payload)) in got.iter().zip(&expect) {
            prop_assert_eq!((e.ts, e.cpu), (*ts, *cpu));
            prop_assert_eq!(&e.data[..payload.len()], &payload[..]);
        }
        let bytes = std::fs::read(&path).unwrap();
        let from_memory = Reader::from_bytes(bytes).unwrap();
        prop_assert_eq!(from_memory.events().count(), expect.len());
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_page_holds_what_the_data_size_allows() {
    // One event that fills the data area exactly still decodes.
    let mut w = PageWriter::new(0);
    assert!(w.push(1, &vec![7u8; DATA_SIZE - 8]));
    let page = w.finish(None);
    let d = decode_page(&page, &PageLayout::DEFAULT).unwrap();
    assert_eq!(d.records.len(), 1);
    assert_eq!(d.records[0].len, DATA_SIZE - 8);
}
