//! The probe-hit path (`record_size`, `run`, `save_entry`) allocates nothing:
//! a counting global allocator watches it run programs of every kind.

use std::ffi::CString;

use ustrace_probe::*;

#[global_allocator]
static GLOBAL: ustrace_testalloc::CountingAllocator = ustrace_testalloc::CountingAllocator;

struct Ctx {
    args: [u64; 6],
    entry: [u64; 4],
}

impl FetchContext for Ctx {
    fn arg(&self, n: usize) -> u64 {
        self.args[n]
    }
    fn stack_pointer(&self) -> u64 {
        self.args.as_ptr() as u64
    }
    fn comm(&self) -> &[u8] {
        b"noalloc\0\0\0\0\0\0\0\0\0"
    }
    fn entry_data(&self) -> &[u64] {
        &self.entry
    }
    fn event_record(&self) -> &[u8] {
        &SOURCE_RECORD
    }
}

/// An eprobe's source record: `a` u32 at 8, `b` u16 at 12, `c` u8 at 14, `q` u64 at 16,
/// `s` a `__data_loc` string at 24 (3 bytes at 28).
static SOURCE_RECORD: [u8; 32] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 8, 9, 10, 11, 12, 13, 14, 15, 28, 0, 3, 0,
    b'x', b'y', 0, 0,
];

/// The source event of the eprobe lines.
struct SourceEnv;

impl ProbeEnv for SourceEnv {
    fn event_fields(&self, _system: &str, _event: &str) -> Option<Vec<FieldSpec>> {
        let f = |name: &str, c_type: &str, offset, size, kind| FieldSpec {
            name: name.into(),
            c_type: c_type.into(),
            offset,
            size,
            signed: false,
            kind,
        };
        Some(vec![
            f("a", "u32", 8, 4, FieldKind::Int),
            f("b", "u16", 12, 2, FieldKind::Int),
            f("c", "u8", 14, 1, FieldKind::Int),
            f("q", "u64", 16, 8, FieldKind::Int),
            f("s", "__data_loc char[]", 24, 4, FieldKind::DynString),
        ])
    }
}

#[test]
fn probe_hit_path_does_not_allocate() {
    let s = CString::new("a string").unwrap();
    let ptrs = [s.as_ptr(), s.as_ptr()];
    let lines: [(&str, &dyn ProbeEnv); 4] = [
        (
            "f foo a=$arg1 s=+0($arg2):string u=+0($arg2):ustring bad=+0($arg4):string \
             arr=+0($arg2):u8[8] sa=+0($arg3):string[2] c=$comm k=\\\"imm\" b=$arg1:b4@2/32 \
             st=$stack1 sym=$arg1:symstr",
            &NoEnv,
        ),
        ("f foo%return r=$retval e=$arg2 e2=+0($arg2):string", &NoEnv),
        // Eprobes: field copies only, then copies beside strings.
        (
            "e:t/e s.e a=$a:u32 b=$b:u16 c=$c:u8 q=$q:x64 w=$b:u64",
            &SourceEnv,
        ),
        (
            "e:t/f s.e a=$a:u32 s=$s:string q=$q:u64 n=+0($s):u8",
            &SourceEnv,
        ),
    ];
    let ctx = Ctx {
        args: [0x12345, s.as_ptr() as u64, ptrs.as_ptr() as u64, 0x10, 0, 0],
        entry: [s.as_ptr() as u64; 4],
    };
    let mut buf = vec![0u8; 4096];
    let mut edata = [0u64; 4];
    for (line, env) in lines {
        let Ok(DynCommand::Create(d)) = parse_command(line, env) else {
            panic!("{line}");
        };
        let prog = d.compile(Some(ustrace_inspect::symbols::inventory()));
        // Warm up (first fault-safe read installs its signal handler).
        let n = prog.record_size(&ctx);
        prog.run(&ctx, &mut buf[..n]);
        let mut used = 0;
        let allocations = ustrace_testalloc::count_in_process(|| {
            for _ in 0..100 {
                prog.save_entry(&ctx, &mut edata);
                let n = prog.record_size(&ctx);
                used = prog.run(&ctx, &mut buf[..n]);
            }
        });
        assert!(used > 0);
        assert_eq!(allocations, 0, "allocations while running {line}");
    }
}
