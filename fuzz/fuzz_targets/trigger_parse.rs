//! Fuzz the trigger-command parser: any write must parse or fail cleanly, and
//! a parsed command's filter must go through the filter compiler without
//! panicking. Seeds: crates/ustrace-filter/tests/corpus/triggers.txt.
//!
//! Seeds: one file per corpus line, e.g.
//! `mkdir -p seeds/trigger_parse && grep -v '^## ' ../crates/ustrace-filter/tests/corpus/triggers.txt | split -l 1 - seeds/trigger_parse/s`
//! then `RUSTC_BOOTSTRAP=1 cargo fuzz run trigger_parse seeds/trigger_parse -- -max_total_time=600`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ustrace_filter::trigger::{self, Trigger};
use ustrace_filter::{compile, CompileEnv, Field, MAX_WRITE};

const FIELDS: [Field<'static>; 2] = [
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

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(cmd) = trigger::parse(&text) else {
        return;
    };
    // A page or more is refused on its size, and nothing after a NUL is read.
    assert!(text.len() < MAX_WRITE);
    assert!(cmd.filter.as_deref().is_none_or(|f| !f.contains('\0')));
    if cmd.remove {
        return;
    }
    if let Some(filter) = &cmd.filter {
        let env = CompileEnv {
            nr_cpus: 4,
            ..CompileEnv::default()
        };
        let _ = compile(filter, &FIELDS, &env);
    }
    let trig = Trigger::new(cmd);
    let _ = trig.fire();
    let _ = trig.listing();
});
