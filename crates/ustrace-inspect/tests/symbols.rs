//! Integration tests of the symbol inventory against this very test binary,
//! glibc, and a library dlopen'ed after the first snapshot.

use std::hint::black_box;
use std::time::Instant;

use ustrace_inspect::symbols::{self, SymFlags};

#[no_mangle]
#[inline(never)]
pub extern "C" fn ustrace_inspect_probe_target(x: u64) -> u64 {
    black_box(x).wrapping_mul(31).wrapping_add(black_box(7))
}

mod deep {
    #[inline(never)]
    pub fn nested_rust_target(v: &mut Vec<u32>) -> usize {
        v.push(std::hint::black_box(3));
        v.len()
    }
}

#[test]
fn finds_own_c_symbol_by_name_and_address() {
    let inv = symbols::inventory();
    let addr = ustrace_inspect_probe_target as *const () as usize;
    let found = inv.find("ustrace_inspect_probe_target");
    assert_eq!(found.len(), 1, "{found:?}");
    let s = found[0];
    assert_eq!(s.addr, addr);
    assert!(s.size > 4 && s.size < 4096, "size {}", s.size);
    assert!(inv.objects()[0].is_main);
    assert!(std::sync::Arc::ptr_eq(&s.object, &inv.objects()[0].path));
    let (by_addr, off) = inv.lookup(addr + 3).expect("lookup inside function");
    assert_eq!(by_addr.name, "ustrace_inspect_probe_target");
    assert_eq!(off, 3);
    assert_eq!(
        inv.format_sym_off(addr + 3),
        format!("ustrace_inspect_probe_target+0x3/{:#x}", s.size)
    );
    assert!(inv
        .lookup(addr + s.size)
        .is_none_or(|(o, _)| o.name != s.name));
    // Main-executable functions carry no object suffix.
    assert!(inv
        .available_filter_functions()
        .lines()
        .any(|l| l == "ustrace_inspect_probe_target"));
}

#[test]
fn rust_path_is_demangled_without_hash() {
    let inv = symbols::inventory();
    let addr = deep::nested_rust_target as *const () as usize;
    let (s, off) = inv.lookup(addr).expect("rust function known");
    assert_eq!(off, 0);
    assert_eq!(s.name, "symbols::deep::nested_rust_target");
    assert_ne!(s.mangled, s.name);
    assert!(s.mangled.starts_with("_ZN") || s.mangled.starts_with("_R"));
    assert_eq!(inv.find("symbols::deep::nested_rust_target").len(), 1);
    assert_eq!(inv.find(&s.mangled).len(), 1);
    let mut v = Vec::new();
    assert_eq!(deep::nested_rust_target(&mut v), 1);
}

#[test]
fn libc_function_has_object_suffix() {
    let inv = symbols::inventory();
    let getpid = libc::getpid as *const () as usize;
    let found = inv.find("getpid");
    let s = found
        .iter()
        .find(|s| s.addr == getpid)
        .unwrap_or_else(|| panic!("getpid at {getpid:#x} not in {found:?}"));
    assert!(s.object.contains("libc.so"), "{}", s.object);
    assert_eq!(s.object_name(), "libc.so.6");
    let text = inv.available_filter_functions();
    assert!(text.lines().any(|l| l == "getpid [libc.so.6]"));
    assert!(inv.format_sym_off(getpid).starts_with("getpid+0x0/"));
    assert!(inv.format_sym_off(getpid).ends_with(" [libc.so.6]"));
    assert!(inv
        .available_filter_functions_addrs()
        .lines()
        .any(|l| l == format!("{getpid:x} getpid [libc.so.6]")));
}

#[test]
fn ifunc_is_listed_at_its_resolved_target() {
    let inv = symbols::inventory();
    // SAFETY: plain dlsym in the global scope.
    let target = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"strlen".as_ptr()) } as usize;
    assert_ne!(target, 0);
    let found = inv.find("strlen");
    let s = found
        .iter()
        .find(|s| s.addr == target)
        .unwrap_or_else(|| panic!("strlen at {target:#x} not in {found:?}"));
    assert!(s.ifunc);
    assert!(s.size > 16, "size {}", s.size);
    assert!(s.object.contains("libc.so"));
}

#[test]
fn glob_semantics_on_the_inventory() {
    let inv = symbols::inventory();
    let exact = inv.glob("ustrace_inspect_probe_target");
    assert_eq!(exact.len(), 1);
    assert_eq!(inv.glob("ustrace_inspect_probe_targe?").len(), 1);
    assert_eq!(inv.glob("ustrace_inspect_probe_t[a-z]rget").len(), 1);
    assert_eq!(inv.glob("ustrace_inspect_probe_t[!a]rget").len(), 0);
    assert_eq!(inv.glob("*_inspect_probe_*").len(), 1);
    assert!(inv.glob("*::deep::nested_rust_*").len() == 1);
    let many = inv.glob("pthread_*");
    assert!(many.len() > 5, "{}", many.len());
    assert!(many
        .iter()
        .all(|s| s.name.starts_with("pthread_") || s.mangled.starts_with("pthread_")));
    // One result per address, in address order.
    assert!(many.windows(2).all(|w| w[0].addr < w[1].addr));
    assert!(inv.glob("no_such_function_anywhere_*").is_empty());
    // The :mod: form narrows by object.
    let in_libc = inv.glob_in_object("getpid", "libc");
    assert_eq!(in_libc.len(), 1);
    assert_eq!(inv.glob_in_object("getpid", "libc.so.*").len(), 1);
    assert!(inv.glob_in_object("getpid", "libm").is_empty());
    assert!(inv
        .glob_in_object("ustrace_inspect_probe_target", "libc")
        .is_empty());
}

#[test]
fn functions_are_sorted_and_well_formed() {
    let inv = symbols::inventory();
    let f = inv.functions();
    assert!(f.len() > 1000, "{}", f.len());
    assert!(f.windows(2).all(|w| w[0].addr <= w[1].addr));
    assert!(f.iter().all(|s| s.size > 0 && !s.name.is_empty()));
    let mut s = String::new();
    let addr = ustrace_inspect_probe_target as *const () as usize;
    inv.write_ip_sym(
        &mut s,
        addr,
        SymFlags {
            offset: false,
            addr: true,
        },
    );
    assert_eq!(s, format!("ustrace_inspect_probe_target <{addr:016x}>"));
}

#[test]
fn inventory_is_cached_until_objects_change() {
    let a = symbols::inventory();
    let b = symbols::inventory();
    assert!(std::sync::Arc::ptr_eq(&a, &b) || a.generation() != b.generation());
}

#[test]
fn inventory_builds_and_reports_its_time() {
    let t = Instant::now();
    let inv = symbols::build_inventory();
    let took = t.elapsed();
    eprintln!(
        "inventory: {} functions from {} objects in {:?}",
        inv.functions().len(),
        inv.objects().len(),
        took
    );
    for o in inv.objects() {
        eprintln!("  {} bias={:#x} {:?}", o.path, o.bias, o.source);
    }
    // The time is printed, not asserted (speed is a benchmark's business); what must hold
    // is that the build finds the program and the C library.
    assert!(inv.objects().iter().any(|o| o.path.contains("libc.so")));
    assert!(inv.functions().len() > 1000, "{}", inv.functions().len());
}

#[test]
fn dlopened_library_appears() {
    let src = "int ustrace_dl_probe_fn(int x) { return x * 3 + 1; }\n\
               __attribute__((noinline)) static int helper(int x) { return x ^ 5; }\n\
               int ustrace_dl_probe_other(int x) { return helper(x) + 2; }\n";
    let Some((dir, lib)) = build_shared("dl", src, &[]) else {
        return;
    };
    let before = symbols::inventory();
    assert!(before.find("ustrace_dl_probe_fn").is_empty());
    let cpath = std::ffi::CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: loading a library we just built; its code has no constructors.
    let h = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null());
    // SAFETY: valid handle and name.
    let f = unsafe { libc::dlsym(h, c"ustrace_dl_probe_fn".as_ptr()) } as usize;
    let after = symbols::inventory();
    assert_ne!(before.generation(), after.generation());
    let found = after.find("ustrace_dl_probe_fn");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].addr, f);
    assert!(found[0].object.ends_with("libustrace_dl.so"));
    assert!(after
        .available_filter_functions()
        .lines()
        .any(|l| l == "ustrace_dl_probe_fn [libustrace_dl.so]"));
    // The static helper comes from .symtab (the library is not stripped).
    assert!(!after.find("helper").is_empty());
    assert_eq!(after.glob("ustrace_dl_probe_*").len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Builds `src` into a shared library in a fresh temp dir; `None` (after
/// printing why) when no C compiler is available.
fn build_shared(
    tag: &str,
    src: &str,
    extra: &[&str],
) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let dir = std::env::temp_dir().join(format!("ustrace-inspect-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join("lib.c");
    let lib = dir.join(format!("libustrace_{tag}.so"));
    std::fs::write(&c, src).unwrap();
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O0"])
        .args(extra)
        .arg("-o")
        .arg(&lib)
        .arg(&c)
        .status();
    match status {
        Ok(s) if s.success() => Some((dir, lib)),
        other => {
            eprintln!("skipped: cannot build a shared library with cc: {other:?}");
            None
        }
    }
}

#[test]
fn stripped_library_uses_dynsym_and_sizes_ifunc_from_eh_frame() {
    let src = r#"
        static int impl_fast(int x) { return x + 100; }
        static int impl_slow(int x) { int r = x; for (int i = 0; i < 100; i++) r += 1; return r; }
        static void *pick(void) { return (void *)impl_fast; }
        int ustrace_ifunc_fn(int) __attribute__((ifunc("pick")));
        int ustrace_stripped_plain(int x) { return x * 2; }
        void *ustrace_keep_slow(void) { return (void *)impl_slow; }
    "#;
    let Some((dir, lib)) = build_shared("stripped", src, &["-s"]) else {
        return;
    };
    let cpath = std::ffi::CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: loading a library we just built; the ifunc resolver is trivial.
    let h = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null());
    // SAFETY: valid handle and names.
    let (ifunc_target, plain) = unsafe {
        (
            libc::dlsym(h, c"ustrace_ifunc_fn".as_ptr()) as usize,
            libc::dlsym(h, c"ustrace_stripped_plain".as_ptr()) as usize,
        )
    };
    let inv = symbols::inventory();
    let obj = inv
        .objects()
        .iter()
        .find(|o| o.path.ends_with("libustrace_stripped.so"))
        .expect("object listed");
    assert_eq!(obj.source, symbols::SymbolSource::Dynsym);
    let p = inv.find("ustrace_stripped_plain");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].addr, plain);
    // Static functions are gone with .symtab.
    assert!(inv.find("impl_slow").is_empty());
    let f = inv.find("ustrace_ifunc_fn");
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].ifunc);
    assert_eq!(f[0].addr, ifunc_target);
    // impl_fast at -O0 is a handful of instructions; the FDE gives its exact extent.
    assert!(f[0].size > 4 && f[0].size < 64, "size {}", f[0].size);
    assert_eq!(
        inv.lookup(ifunc_target + 1).unwrap().0.name,
        "ustrace_ifunc_fn"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn vdso_functions_are_listed() {
    let inv = symbols::inventory();
    let Some(vdso) = inv
        .objects()
        .iter()
        .find(|o| o.path.starts_with("linux-vdso"))
    else {
        eprintln!("skipped: no vdso in this process");
        return;
    };
    assert_eq!(
        vdso.source,
        symbols::SymbolSource::Memory,
        "{:?}",
        vdso.source
    );
    // The vDSO exports both names at one address; lookups prefer the one
    // without underscores.
    let found = inv.find("__vdso_clock_gettime");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].object_name(), "linux-vdso.so.1");
    let (s, off) = inv.lookup(found[0].addr + 1).unwrap();
    assert_eq!((s.name.as_str(), off), ("clock_gettime", 1));
    assert!(inv
        .available_filter_functions()
        .lines()
        .any(|l| l == "clock_gettime [linux-vdso.so.1]"));
}

#[test]
fn lookups_while_libraries_come_and_go() {
    let src = "int ustrace_churn_fn(int x) { return x + 11; }\n";
    let Some((dir, lib)) = build_shared("churn", src, &[]) else {
        return;
    };
    let cpath = std::ffi::CString::new(lib.to_str().unwrap()).unwrap();
    let own = ustrace_inspect_probe_target as *const () as usize;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..cores + 2 {
            s.spawn(|| {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || n == 0 {
                    let inv = symbols::inventory();
                    let (sym, _) = inv.lookup(own + 1).expect("own function");
                    assert_eq!(sym.name, "ustrace_inspect_probe_target");
                    n += 1;
                }
            });
        }
        let rounds: usize = std::env::var("USTRACE_STRESS_SECS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(2, |secs| secs.max(1) * 4);
        for _ in 0..rounds {
            // SAFETY: loading and unloading a constructor-free library we built.
            let h = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW) };
            assert!(!h.is_null());
            let inv = symbols::inventory();
            assert_eq!(inv.find("ustrace_churn_fn").len(), 1);
            drop(inv);
            // SAFETY: no pointer into the library outlives this point.
            unsafe { libc::dlclose(h) };
            assert!(symbols::inventory().find("ustrace_churn_fn").is_empty());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

static CTOR_SAW_OWN_FUNCTION: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

extern "C" fn from_constructor() {
    // Runs inside dlopen, under the loader's lock.
    let inv = symbols::inventory();
    let own = ustrace_inspect_probe_target as *const () as usize;
    let ok = inv
        .lookup(own)
        .is_some_and(|(s, _)| s.name == "ustrace_inspect_probe_target");
    CTOR_SAW_OWN_FUNCTION.store(ok, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn inventory_from_a_library_constructor_while_others_build() {
    // libhook holds a function pointer; libctor's constructor calls it.
    let Some((dir_a, lib_a)) = build_shared("hook", "void (*ustrace_hook)(void);\n", &[]) else {
        return;
    };
    let ctor_src = "extern void (*ustrace_hook)(void);\n\
                    __attribute__((constructor)) static void init(void) { if (ustrace_hook) ustrace_hook(); }\n\
                    int ustrace_ctor_lib_fn(void) { return 1; }\n";
    let link = format!("-L{}", dir_a.display());
    let rpath = format!("-Wl,-rpath,{}", dir_a.display());
    let Some((dir_b, lib_b)) = build_shared("ctor", ctor_src, &[&link, &rpath, "-lustrace_hook"])
    else {
        return;
    };
    let a = std::ffi::CString::new(lib_a.to_str().unwrap()).unwrap();
    let b = std::ffi::CString::new(lib_b.to_str().unwrap()).unwrap();
    // SAFETY: loading our own constructor-free library and setting its pointer.
    unsafe {
        let h = libc::dlopen(a.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        assert!(!h.is_null());
        let slot = libc::dlsym(h, c"ustrace_hook".as_ptr()) as *mut extern "C" fn();
        assert!(!slot.is_null());
        *slot = from_constructor;
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Others keep rebuilding while the constructor runs.
        for _ in 0..2 {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = symbols::build_inventory();
                    let _ = symbols::inventory();
                }
            });
        }
        // SAFETY: loading a library whose constructor calls back into us.
        let h = unsafe { libc::dlopen(b.as_ptr(), libc::RTLD_NOW) };
        assert!(!h.is_null());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(CTOR_SAW_OWN_FUNCTION.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(symbols::inventory().find("ustrace_ctor_lib_fn").len(), 1);
    let _ = std::fs::remove_dir_all(&dir_a);
    let _ = std::fs::remove_dir_all(&dir_b);
}
