//! Fuzz the filter compiler and evaluator: any text must compile or fail
//! cleanly (no panic, bounded time and memory), and a compiled program must
//! evaluate any record without panicking. Seeds: crates/ustrace-filter/tests/corpus/filters.txt.
//!
//! Seeds: one file per corpus line (escapes left as written is fine), e.g.
//! `mkdir -p seeds/filter_parse && grep -v '^## ' ../crates/ustrace-filter/tests/corpus/filters.txt | split -l 1 - seeds/filter_parse/s`
//! then `RUSTC_BOOTSTRAP=1 cargo fuzz run filter_parse seeds/filter_parse -- -max_total_time=600`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ustrace_filter::{compile, is_clear, CompileEnv, Context, Field, MAX_WRITE};

const FIELDS: [Field<'static>; 6] = [
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
    Field {
        name: "name",
        c_type: "char[16]",
        offset: 16,
        size: 16,
        signed: false,
    },
    Field {
        name: "path",
        c_type: "__data_loc char[]",
        offset: 32,
        size: 4,
        signed: false,
    },
    Field {
        name: "ptr",
        c_type: "const char *",
        offset: 40,
        size: 8,
        signed: false,
    },
    Field {
        name: "mask",
        c_type: "__data_loc cpumask_t",
        offset: 48,
        size: 4,
        signed: false,
    },
];

fuzz_target!(|data: &[u8]| {
    // The input is both the expression and, whole or halved, the record.
    let text = String::from_utf8_lossy(data);
    let resolve = |name: &str| (name.len() % 3 == 0).then_some(0x1000u64..0x2000);
    let by_addr = |a: u64| (a % 2 == 0).then_some(a..a + 16);
    let env = CompileEnv {
        resolve_function: Some(&resolve),
        resolve_address: Some(&by_addr),
        nr_cpus: 8,
    };
    // A page or more is refused on its size alone, never taken as the clear command.
    let too_long = text.len() >= MAX_WRITE;
    if too_long {
        assert!(!is_clear(&text));
    }
    match compile(&text, &FIELDS, &env) {
        Ok(prog) => {
            let reader = |addr: u64, buf: &mut [u8]| -> Option<usize> {
                if addr % 2 == 1 {
                    return None;
                }
                let n = (addr as usize) % (buf.len() + 1);
                buf[..n].fill(b'a');
                Some(n)
            };
            let ctx = Context {
                cpu: (data.len() % 8) as u32,
                comm: b"fuzz",
                read_str: Some(&reader),
            };
            let _ = prog.matches(data, &ctx);
            let _ = prog.matches(&data[..data.len() / 2], &ctx);
            assert!(!too_long && !prog.text().contains('\0'));
            assert!(compile(prog.text(), &FIELDS, &env).is_ok());
        }
        Err(e) => {
            assert_eq!(e.is_write_too_long(), too_long);
            // What the kernel shows ends at the write's first NUL.
            let shown = e.filter_file_text(&text);
            let (first, rest) = e.error_log_entry(&text);
            assert!(!shown.contains('\0') && !first.contains('\0') && !rest.contains('\0'));
            assert!(e.errno() > 0);
        }
    }
});
