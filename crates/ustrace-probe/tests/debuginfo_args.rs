//! Named (debug-info) arguments against real functions of this test binary,
//! resolved through DWARF by `ustrace_inspect::debuginfo`.

use std::ffi::{c_char, CString};
use std::hint::black_box;

use ustrace_probe::*;

#[repr(C)]
pub struct Inner {
    pub flags: u32,
    pub label: [u8; 8],
}

#[repr(C)]
pub struct Pair {
    pub x: u32,
    pub name: *const c_char,
    pub inner: Inner,
    pub next: *const Pair,
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn ustrace_probe_target(p: *const Pair, count: u64, delta: i32) -> i64 {
    black_box(p);
    black_box(count as i64 + i64::from(delta))
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn ustrace_probe_void(p: *const Pair) {
    black_box(p);
}

fn env() -> Option<InspectEnv> {
    // Keep both functions in the binary.
    black_box(ustrace_probe_target(std::ptr::null(), 1, 2));
    ustrace_probe_void(std::ptr::null());
    let env = InspectEnv::new();
    if env.function_info("ustrace_probe_target").is_none() {
        eprintln!("skipped: no DWARF for this test binary (built without debug info?)");
        return None;
    }
    Some(env)
}

fn define(line: &str, env: &dyn ProbeEnv) -> ProbeDefinition {
    match parse_command(line, env) {
        Ok(DynCommand::Create(d)) => d,
        other => panic!("{line}: {other:?}"),
    }
}

fn err(line: &str, env: &dyn ProbeEnv) -> (ErrorId, usize) {
    match parse_command(line, env) {
        Err(e) => (e.id.expect("a logged error"), e.caret()),
        other => panic!("{line} should fail: {other:?}"),
    }
}

struct Ctx {
    args: [u64; 6],
    entry: Vec<u64>,
    ret: u64,
}

impl FetchContext for Ctx {
    fn arg(&self, n: usize) -> u64 {
        self.args[n]
    }
    fn stack_pointer(&self) -> u64 {
        0
    }
    fn comm(&self) -> &[u8] {
        b"t\0"
    }
    fn entry_data(&self) -> &[u64] {
        &self.entry
    }
    fn return_value(&self) -> u64 {
        self.ret
    }
}

#[test]
fn named_arguments_take_their_types_from_dwarf() {
    let Some(env) = env() else { return };
    let d = define("f:fprobes/myprobe ustrace_probe_target p count delta", &env);
    assert_eq!(
        d.canonical(),
        "f:fprobes/myprobe ustrace_probe_target p=p count=count delta=delta"
    );
    let p = d.compile(None);
    assert_eq!(
        p.print_fmt(),
        "\"(%lx) p=0x%Lx count=%Lu delta=%d\", REC->__probe_ip, REC->p, REC->count, REC->delta"
    );
    let star = define("f ustrace_probe_target $arg*", &env);
    assert_eq!(
        star.canonical(),
        "f:fprobes/ustrace_probe_target__entry ustrace_probe_target p=p count=count delta=delta"
    );
    let n = define("f ustrace_probe_target $arg2:x16", &env);
    assert_eq!(
        n.canonical(),
        "f:fprobes/ustrace_probe_target__entry ustrace_probe_target count=count:x16"
    );
    let r = define("f ustrace_probe_target%return $retval", &env);
    assert!(r.compile(None).print_fmt().contains("arg1=%Ld"));
}

#[test]
fn member_access_runs_on_real_structs() {
    let Some(env) = env() else { return };
    let name = CString::new("pair-name").unwrap();
    let tail = Pair {
        x: 99,
        name: std::ptr::null(),
        inner: Inner {
            flags: 0,
            label: *b"tail\0\0\0\0",
        },
        next: std::ptr::null(),
    };
    let head = Pair {
        x: 7,
        name: name.as_ptr(),
        inner: Inner {
            flags: 0x30,
            label: *b"label\0\0\0",
        },
        next: &tail,
    };
    let d = define(
        "f ustrace_probe_target x=p->x nm=p->name:string lbl=p->inner.label:string \
         fl=p->inner.flags nx=p->next->x c=count",
        &env,
    );
    let prog = d.compile(None);
    let ctx = Ctx {
        args: [&head as *const Pair as u64, 5, 0, 0, 0, 0],
        entry: Vec::new(),
        ret: 0,
    };
    let mut rec = vec![0u8; 8 + prog.record_size(&ctx)];
    prog.run(&ctx, &mut rec[8..]);
    let mut out = String::new();
    prog.print_args(&rec, None, &mut out);
    assert_eq!(out, " x=7 nm=\"pair-name\" lbl=\"label\" fl=48 nx=99 c=5");

    // An exit probe reads `p` saved at entry.
    let d = define("f ustrace_probe_target%return r=$retval x=p->x", &env);
    let prog = d.compile(None);
    assert_eq!(prog.entry_data_size(), 8);
    let mut edata = [0u64; 1];
    prog.save_entry(&ctx, &mut edata);
    let exit = Ctx {
        args: [0; 6],
        entry: edata.to_vec(),
        ret: 12,
    };
    let mut rec = vec![0u8; 8 + prog.record_size(&exit)];
    prog.run(&exit, &mut rec[8..]);
    let mut out = String::new();
    prog.print_args(&rec, None, &mut out);
    assert_eq!(out, " r=12 x=7");
}

#[test]
fn debug_info_errors() {
    let Some(env) = env() else { return };
    let cases: &[(&str, ErrorId, usize)] = &[
        ("f ustrace_probe_target nope", ErrorId::NO_BTFARG, 23),
        (
            "f ustrace_probe_target count:string",
            ErrorId::BAD_TYPE4STR,
            23,
        ),
        ("f ustrace_probe_target p.x", ErrorId::NOSUP_DAT_ARG, 24),
        ("f ustrace_probe_target p-x", ErrorId::BAD_HYPHEN, 24),
        ("f ustrace_probe_target p->zz", ErrorId::NO_BTF_FIELD, 26),
        ("f ustrace_probe_target count->x", ErrorId::NO_PTR_STRCT, 30),
        ("f ustrace_probe_target $arg9", ErrorId::ARGIDX_2BIG, 23),
        (
            "f ustrace_probe_target $arg* $arg*",
            ErrorId::DOUBLE_ARGS,
            29,
        ),
        (
            "f ustrace_probe_target $arg*:u32",
            ErrorId::BAD_VAR_ARGS,
            23,
        ),
        // The caret at `$arg*`, past the name (dynevent/fprobe_syntax_errors.tc).
        ("f ustrace_probe_target a=$arg*", ErrorId::BAD_VAR_ARGS, 25),
        (
            "f ustrace_probe_void%return $retval",
            ErrorId::NO_RETVAL,
            28,
        ),
        (
            "f ustrace_probe_target%return $retval->x",
            ErrorId::NO_PTR_STRCT,
            39,
        ),
        ("f no_such_function_xyz foo", ErrorId::NO_BTF_ENTRY, 23),
        ("f no_such_function_xyz $arg*", ErrorId::NOSUP_BTFARG, 23),
        (
            "f no_such_function_xyz%return $retval->x",
            ErrorId::NO_BTF_ENTRY,
            39,
        ),
    ];
    for (line, id, caret) in cases {
        assert_eq!(err(line, &env), (*id, *caret), "{line}");
    }
}
