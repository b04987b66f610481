//! Fuzz the synthetic-event grammar (`synthetic_events` lines and `s:` lines of
//! `dynamic_events`): any input must parse or fail cleanly with a caret inside the
//! command; an accepted definition must keep the kernel's limits and parse back, from
//! its listing, to the same definition.
//!
//! Seeds: the selftests' lines, e.g.
//! `mkdir -p seeds/synth_parse && printf 'wakeup u64 lat; pid_t pid; char comm[16]; char n[]; unsigned long[] st' > seeds/synth_parse/a`
//! then `RUSTC_BOOTSTRAP=1 cargo fuzz run synth_parse seeds/synth_parse -- -max_total_time=600`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ustrace_filter::synth::{
    parse_dyn_line, parse_line, SynthCommand, SynthDef, SynthFieldKind, STR_VAR_LEN_MAX,
    SYNTH_FIELDS_MAX,
};

fn check(def: &SynthDef) {
    assert!(!def.fields.is_empty() && def.fields.len() <= SYNTH_FIELDS_MAX);
    for f in &def.fields {
        match f.kind {
            SynthFieldKind::StaticString => assert!(f.size > 0 && f.size <= STR_VAR_LEN_MAX),
            SynthFieldKind::Int => assert!(matches!(f.size, 1 | 2 | 4 | 8)),
            SynthFieldKind::DynString | SynthFieldKind::Stack => {
                assert!(f.c_type.starts_with("__data_loc ") && f.size == 8)
            }
        }
    }
    let again = parse_line(&def.command(), &|_| false);
    assert_eq!(again, Ok(SynthCommand::Create(def.clone())));
    let fmt = def.print_fmt();
    assert!(def.fields.iter().all(|f| fmt.contains(f.name.as_str())));
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let taken = |name: &str| name.len() == 3;
    for result in [Some(parse_line(&text, &taken)), parse_dyn_line(&text, &taken)]
        .into_iter()
        .flatten()
    {
        match result {
            Ok(SynthCommand::Create(def)) => {
                assert!(!taken(&def.name));
                check(&def);
            }
            Ok(_) => {}
            Err(e) => assert!(e.pos <= e.command.len() && !e.log_text().is_empty()),
        }
    }
});
