//! Fuzzes the hist-trigger parser: whatever text is written after `hist:`, parsing against a
//! kmalloc-like event returns (never panics); an error's caret lies inside the command; a
//! parsed trigger keeps the kernel's limits, its key layout fits the largest key, and its
//! info line is a fixed point (what it says parses to a trigger that prints it again).
//! Seeds: the writes of `crates/ustrace/tests/hist.rs` and
//! `crates/ustrace-filter/src/hist/tests.rs`; run with
//! `RUSTC_BOOTSTRAP=1 cargo fuzz run hist_trigger_parse -- -max_total_time=600`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ustrace_filter::hist::{self, EventField, HistEnv, KEYS_MAX, KEY_SIZE_MAX, VALS_MAX, VARS_MAX};

struct Kmalloc;

impl HistEnv for Kmalloc {
    fn event(&self) -> (&str, &str) {
        ("kmem", "kmalloc")
    }
    fn field(&self, name: &str) -> Option<EventField> {
        let f = |name: &str, c_type: &str, offset, size, signed| EventField {
            name: name.into(),
            c_type: c_type.into(),
            offset,
            size,
            signed,
        };
        [
            f("common_pid", "int", 4, 4, true),
            f("call_site", "unsigned long", 8, 8, false),
            f("bytes_req", "size_t", 16, 8, false),
            f("gfp_flags", "gfp_t", 24, 4, false),
            f("comm", "char[16]", 28, 16, false),
            f("name", "__data_loc char[]", 44, 4, false),
        ]
        .into_iter()
        .find(|f| f.name == name)
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for remove in [false, true] {
        match hist::parse(text, &Kmalloc, remove) {
            Err(e) => assert!(e.pos <= text.len() + "hist:".len(), "{e:?}"),
            Ok(h) => {
                assert!(h.n_keys >= 1 && h.n_keys <= KEYS_MAX);
                assert!(h.n_sums() >= 1 && h.n_sums() <= VALS_MAX);
                assert!(h.n_vars <= VARS_MAX);
                assert!(h.key_size <= KEY_SIZE_MAX);
                assert!(h.keys().iter().all(|k| k.offset + k.size <= h.key_size));
                assert!((1..=2).contains(&h.sort_keys.len()));
                let info = h.info(None, h.filter.as_deref(), false);
                let spec = info
                    .strip_prefix("hist:")
                    .and_then(|s| s.strip_suffix(" [active]"))
                    .expect("info line shape");
                if let Ok(again) = hist::parse(spec, &Kmalloc, remove) {
                    assert_eq!(again.info(None, again.filter.as_deref(), false), info);
                }
            }
        }
    }
});
