//! Fuzz the dynamic-event language: any line must parse or fail cleanly (no
//! panic, bounded time and memory); an accepted definition must re-parse from
//! its canonical text, and its program must size, run and print a record for
//! a fake probe hit whose memory is simulated (no real reads).
//! Seeds: crates/ustrace-probe/tests/corpus/definitions.txt.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ustrace_probe::{
    parse_command, DynCommand, FetchContext, FieldKind, FieldSpec, ProbeEnv, COMMON_HEADER_SIZE,
};

struct Env;

impl ProbeEnv for Env {
    fn event_fields(&self, system: &str, event: &str) -> Option<Vec<FieldSpec>> {
        let f = |name: &str, offset, size, kind| FieldSpec {
            name: name.to_owned(),
            c_type: String::new(),
            offset,
            size,
            signed: true,
            kind,
        };
        (system == "sched" && event == "sched_switch").then(|| {
            vec![
                f("pid", 8, 4, FieldKind::Int),
                f("comm", 12, 16, FieldKind::CharArray),
                f("msg", 28, 4, FieldKind::DynString),
            ]
        })
    }
    fn resolve_symbol(&self, name: &str) -> Option<u64> {
        (name.len() % 2 == 0).then_some(0x4000)
    }
}

/// A probe hit over simulated memory: addresses below 0x10000 read as a
/// pattern (strings end every 37 bytes), everything else faults.
struct Ctx {
    record: [u8; 40],
    entry: [u64; 16],
}

impl FetchContext for Ctx {
    fn arg(&self, n: usize) -> u64 {
        0x100 * n as u64
    }
    fn register(&self, name: &str) -> Option<u64> {
        (name.len() == 2).then_some(0x2000)
    }
    fn stack_pointer(&self) -> u64 {
        0x8000
    }
    fn return_value(&self) -> u64 {
        0x3000
    }
    fn comm(&self) -> &[u8] {
        b"fuzzer\0\0\0\0\0\0\0\0\0\0"
    }
    fn event_record(&self) -> &[u8] {
        &self.record
    }
    fn entry_data(&self) -> &[u64] {
        &self.entry
    }
    fn read(&self, addr: u64, buf: &mut [u8], _user: bool) -> bool {
        if addr.checked_add(buf.len() as u64).is_none_or(|end| end > 0x10000) {
            return false;
        }
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (addr as usize + i) as u8;
        }
        true
    }
    fn read_str(&self, addr: u64, buf: &mut [u8], _user: bool) -> Option<usize> {
        if addr >= 0x10000 {
            return None;
        }
        for (i, b) in buf.iter_mut().enumerate() {
            let a = addr as usize + i;
            if a % 37 == 0 {
                *b = 0;
                return Some(i);
            }
            *b = b'a' + (a % 26) as u8;
        }
        Some(buf.len())
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for line in text.lines().take(4) {
        let Ok(DynCommand::Create(def)) = parse_command(line, &Env) else {
            continue;
        };
        let again = parse_command(&def.canonical(), &Env);
        match again {
            Ok(DynCommand::Create(d2)) => assert_eq!(d2.canonical(), def.canonical()),
            other => panic!("canonical {:?} re-parsed as {other:?}", def.canonical()),
        }
        let prog = def.compile(None);
        let _ = prog.print_fmt();
        let _ = prog.fields();
        let mut record = [0u8; 40];
        record[8..12].copy_from_slice(&7i32.to_le_bytes());
        record[12..18].copy_from_slice(b"hello\0");
        record[28..32].copy_from_slice(&((4u32 << 16) | 32).to_le_bytes());
        record[32..36].copy_from_slice(b"abc\0");
        let ctx = Ctx { record, entry: [0x500; 16] };
        let need = prog.record_size(&ctx);
        assert!(need < 1 << 20, "record of {need} bytes");
        let mut rec = vec![0u8; COMMON_HEADER_SIZE + need];
        let used = prog.run(&ctx, &mut rec[COMMON_HEADER_SIZE..]);
        assert!(used <= need);
        let mut out = String::new();
        prog.print_event(&def, &rec, None, &mut out);
    }
});
