//! DWARF signatures: a C library built with -g, and glibc via its build-id
//! debug file when installed.

use std::ffi::CString;

use ustrace_inspect::debuginfo::{self, BaseEncoding, Step, TypeKind};
use ustrace_inspect::symbols;

const SRC: &str = r#"
#include <stddef.h>
struct inner { int a; char name[16]; };
struct outer {
    long x;
    struct inner in;
    struct outer *next;
    union { int u1; long u2; };
    unsigned flag : 3;
    unsigned mode : 5;
};
typedef unsigned long my_size_t;
size_t off_in_name = offsetof(struct outer, in.name);
size_t off_next = offsetof(struct outer, next);
size_t off_u2 = offsetof(struct outer, u2);
size_t off_x = offsetof(struct outer, x);
long ustrace_dbg_fn(my_size_t count, struct outer *o, const char *s, double ratio, int last) {
    return (long)count + o->x + s[0] + (long)ratio + last;
}
void ustrace_dbg_void(void) {}
"#;

fn build(dwarf: &str) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let dir =
        std::env::temp_dir().join(format!("ustrace-inspect-dbg{dwarf}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join("dbg.c");
    let lib = dir.join(format!("libustrace_dbg{dwarf}.so"));
    std::fs::write(&c, SRC).unwrap();
    match std::process::Command::new("cc")
        .args([
            "-shared",
            "-fPIC",
            "-O0",
            "-gstrict-dwarf",
            &format!("-gdwarf-{dwarf}"),
            "-o",
        ])
        .arg(&lib)
        .arg(&c)
        .status()
    {
        Ok(s) if s.success() => Some((dir, lib)),
        other => {
            eprintln!("skipped: cannot build a shared library with cc: {other:?}");
            None
        }
    }
}

fn dlsym_usize(h: *mut libc::c_void, name: &str) -> usize {
    let c = CString::new(name).unwrap();
    // SAFETY: valid handle; the symbol is a size_t variable.
    unsafe { *(libc::dlsym(h, c.as_ptr()) as *const usize) }
}

#[test]
fn c_function_parameters_types_and_field_paths_dwarf5() {
    check_c_library("5");
}

/// DWARF 2 writes member offsets as `DW_OP_plus_uconst` expressions.
#[test]
fn c_function_parameters_types_and_field_paths_dwarf2() {
    check_c_library("2");
}

fn check_c_library(dwarf: &str) {
    let Some((dir, lib)) = build(dwarf) else {
        return;
    };
    let cpath = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: loading a library we just built.
    let h = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null());
    let inv = symbols::inventory();
    let sym = inv
        .find("ustrace_dbg_fn")
        .into_iter()
        .find(|s| s.object.ends_with(&format!("libustrace_dbg{dwarf}.so")))
        .expect("function of this library");
    let f = debuginfo::function_info(&inv, sym).unwrap();
    assert_eq!(f.name, "ustrace_dbg_fn");
    let t = &f.types;
    let names: Vec<_> = f.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["count", "o", "s", "ratio", "last"]);

    let count = f.param("count").unwrap();
    assert_eq!(t.c_name(count.ty), "my_size_t");
    assert_eq!(t.size_of(count.ty), Some(8));
    assert!(!t.is_signed(count.ty));
    assert_eq!(
        t.get(t.strip(count.ty)).kind,
        TypeKind::Base(BaseEncoding::Unsigned)
    );
    assert_eq!(count.abi_index, Some(0));

    let o = f.param("o").unwrap();
    assert_eq!(t.c_name(o.ty), "struct outer *");
    assert!(t.is_pointer(o.ty));
    assert_eq!(o.abi_index, Some(1));

    let s = f.param("s").unwrap();
    assert!(t.is_char_pointer(s.ty));
    assert_eq!(s.abi_index, Some(2));
    // The double goes in xmm0, so `last` is the fourth integer argument.
    assert_eq!(f.param("ratio").unwrap().abi_index, None);
    assert_eq!(f.param("last").unwrap().abi_index, Some(3));
    assert!(t.is_signed(f.param("last").unwrap().ty));
    let ret = f.ret.unwrap();
    assert_eq!(t.c_name(ret), "long int");
    assert!(t.is_signed(ret));

    // o->in.name: one addition, a char[16] there.
    let r = t.resolve(o.ty, "->in.name").unwrap();
    assert_eq!(r.steps, [Step::Add(dlsym_usize(h, "off_in_name") as u64)]);
    assert!(t.is_char_array(r.ty));
    assert_eq!(t.c_name(r.ty), "char[16]");
    assert_eq!(t.size_of(r.ty), Some(16));
    // o->next->x: add, load the pointer, add.
    let r = t.resolve(o.ty, "->next->x").unwrap();
    assert_eq!(
        r.steps,
        [
            Step::Add(dlsym_usize(h, "off_next") as u64),
            Step::Load,
            Step::Add(dlsym_usize(h, "off_x") as u64)
        ]
    );
    // Anonymous union member, reached directly as in C.
    let r = t.resolve(o.ty, "->u2").unwrap();
    assert_eq!(r.steps, [Step::Add(dlsym_usize(h, "off_u2") as u64)]);
    // Bitfields carry their position.
    let flag = t.resolve(o.ty, "->flag").unwrap();
    let mode = t.resolve(o.ty, "->mode").unwrap();
    assert_eq!(flag.bits.map(|b| b.1), Some(3));
    assert_eq!(mode.bits.map(|b| b.1), Some(5));
    // Errors name what went wrong.
    assert!(t
        .resolve(o.ty, "->nope")
        .unwrap_err()
        .to_string()
        .contains("no member 'nope'"));
    assert!(t.resolve(o.ty, ".x").is_err());
    assert!(t
        .resolve(count.ty, "->x")
        .unwrap_err()
        .to_string()
        .contains("non-pointer"));
    assert!(t.resolve(o.ty, "->in->a").is_err());

    let void = inv
        .find("ustrace_dbg_void")
        .into_iter()
        .find(|s| s.object.ends_with(&format!("libustrace_dbg{dwarf}.so")))
        .expect("function of this library");
    let v = debuginfo::function_info(&inv, void).unwrap();
    assert!(v.params.is_empty());
    assert!(v.ret.is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn glibc_signature_from_build_id_debug_file() {
    let inv = symbols::inventory();
    let Some(libc_obj) = inv.objects().iter().find(|o| o.path.contains("libc.so")) else {
        eprintln!("skipped: libc not found in inventory");
        return;
    };
    let has_debug = libc_obj
        .build_id
        .as_deref()
        .and_then(symbols::debug_file_for_build_id)
        .is_some();
    if !has_debug {
        eprintln!("skipped: no glibc debug file (apt-get install libc6-dbg)");
        return;
    }
    let t0 = std::time::Instant::now();
    let f = debuginfo::function_info_by_name(&inv, "read").unwrap();
    eprintln!(
        "glibc read(): {:?} in {:?}",
        f.params
            .iter()
            .map(|p| (&p.name, f.types.c_name(p.ty)))
            .collect::<Vec<_>>(),
        t0.elapsed()
    );
    assert_eq!(f.params.len(), 3);
    assert_eq!(f.params[0].name, "fd");
    assert!(f.types.is_pointer(f.params[1].ty));
    assert_eq!(f.types.size_of(f.params[2].ty), Some(8));
    assert!(f.source.contains(".build-id"));
    // The second lookup in the same library reuses the decompressed DWARF.
    let t1 = std::time::Instant::now();
    let w = debuginfo::function_info_by_name(&inv, "write").unwrap();
    let second = t1.elapsed();
    eprintln!("glibc write() next: {second:?}");
    assert_eq!(w.params.len(), 3);
    assert_eq!(w.params[1].name, "buf");
}

#[test]
fn missing_debug_info_is_an_error_not_a_panic() {
    let inv = symbols::inventory();
    let e = debuginfo::function_info_by_name(&inv, "no_such_function_xyz").unwrap_err();
    assert!(e.to_string().contains("no function named"));
}

#[repr(C)]
pub struct Pair {
    pub left: u32,
    pub right: i64,
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn ustrace_rust_dbg_target(count: u64, pair: *const Pair, delta: i16) -> i64 {
    // Only the pointer's type matters to the test; read it fault-safely.
    let right =
        ustrace_inspect::uaccess::read_u64(pair as usize + std::mem::offset_of!(Pair, right))
            .unwrap_or(0);
    count as i64 + right as i64 + delta as i64
}

#[test]
fn rust_function_in_the_main_executable() {
    let p = Pair { left: 1, right: 2 };
    assert_eq!(ustrace_rust_dbg_target(1, &p, 3), 6);
    let inv = symbols::inventory();
    let t0 = std::time::Instant::now();
    let f = match debuginfo::function_info_by_name(&inv, "ustrace_rust_dbg_target") {
        Ok(f) => f,
        Err(e) if e.to_string().contains("no debug info") => {
            eprintln!("skipped: test binary built without debug info: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    eprintln!("rust target from {} in {:?}", f.source, t0.elapsed());
    if f.params.is_empty() && f.ret.is_none() {
        // debug = 1 ("limited", as the release profile uses) keeps only
        // subprograms and line tables: nothing about parameters.
        eprintln!("skipped: test binary has limited debug info (no parameters)");
        return;
    }
    let t = &f.types;
    let names: Vec<_> = f.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["count", "pair", "delta"]);
    assert_eq!(t.c_name(f.params[0].ty), "u64");
    assert!(t.is_signed(f.params[2].ty));
    assert_eq!(t.size_of(f.params[2].ty), Some(2));
    let r = t.resolve(f.params[1].ty, "->right").unwrap();
    assert_eq!(
        r.steps,
        [Step::Add(std::mem::offset_of!(Pair, right) as u64)]
    );
    assert_eq!(t.c_name(r.ty), "i64");
}
