//! `set_ftrace_filter`, `set_ftrace_notrace`, `set_graph_function` and `set_graph_notrace`:
//! the kernel's word syntax resolved against this test binary's own functions.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ustrace::ftrace::filter::{self, CommandCall, FunctionCommand, SetKind};
use ustrace::{Errno, FileSystem, OpenFlags};

macro_rules! probe_fns {
    ($($name:ident),*) => {$(
        #[no_mangle]
        #[inline(never)]
        pub extern "C" fn $name(x: u64) -> u64 {
            std::hint::black_box(x).wrapping_mul(3).wrapping_add(1)
        }
    )*};
}
probe_fns!(
    fsel_alpha,
    fsel_beta,
    fsel_gamma,
    fsel_delta_one,
    fsel_delta_two
);

fn keep_alive() -> u64 {
    fsel_alpha(1) + fsel_beta(2) + fsel_gamma(3) + fsel_delta_one(4) + fsel_delta_two(5)
}

fn instance(name: &str) -> String {
    let fs = ustrace::tracefs();
    let _ = fs.rmdir(&format!("instances/{name}"));
    fs.mkdir(&format!("instances/{name}")).unwrap();
    format!("instances/{name}")
}

fn read(path: &str) -> String {
    ustrace::tracefs().read_to_string(path).unwrap()
}

fn names(text: &str) -> Vec<&str> {
    let mut v: Vec<&str> = text.lines().collect();
    v.sort();
    v
}

#[test]
fn write_append_remove_and_empty_texts() {
    keep_alive();
    let fs = ustrace::tracefs();
    let dir = instance("fsel_basic");
    let filter = format!("{dir}/set_ftrace_filter");
    assert_eq!(read(&filter), "#### all functions enabled ####\n");
    assert_eq!(
        read(&format!("{dir}/set_ftrace_notrace")),
        "#### no functions disabled ####\n"
    );
    // Several words a line.
    fs.write_file(&filter, "fsel_alpha fsel_beta\n").unwrap();
    assert_eq!(names(&read(&filter)), ["fsel_alpha", "fsel_beta"]);
    // `>` truncates, `>>` appends.
    fs.write_file(&filter, "fsel_gamma").unwrap();
    assert_eq!(read(&filter), "fsel_gamma\n");
    fs.append_file(&filter, "fsel_delta_*").unwrap();
    assert_eq!(
        names(&read(&filter)),
        ["fsel_delta_one", "fsel_delta_two", "fsel_gamma"]
    );
    // `!` removes what it matches.
    fs.append_file(&filter, "!*_one").unwrap();
    assert_eq!(names(&read(&filter)), ["fsel_delta_two", "fsel_gamma"]);
    // A glob that matches nothing is EINVAL, and the set is unchanged.
    assert_eq!(
        fs.append_file(&filter, "fsel_no_such_function_zz\n"),
        Err(Errno::EINVAL)
    );
    assert_eq!(names(&read(&filter)), ["fsel_delta_two", "fsel_gamma"]);
    // An empty truncating write clears it.
    fs.write_file(&filter, "\n").unwrap();
    assert_eq!(read(&filter), "#### all functions enabled ####\n");
    fs.rmdir(&dir).unwrap();
}

#[test]
fn words_before_a_bad_one_stay_as_on_the_kernel() {
    keep_alive();
    let fs = ustrace::tracefs();
    let dir = instance("fsel_partial");
    let filter = format!("{dir}/set_ftrace_filter");
    assert_eq!(
        fs.write_file(&filter, "fsel_alpha fsel_nope_zz fsel_beta"),
        Err(Errno::EINVAL)
    );
    // The kernel applies words one by one and commits at close.
    assert_eq!(read(&filter), "fsel_alpha\n");
    fs.rmdir(&dir).unwrap();
}

#[test]
fn a_word_split_across_writes_is_one_word_and_commit_is_at_close() {
    keep_alive();
    let fs = ustrace::tracefs();
    let dir = instance("fsel_split");
    let filter = format!("{dir}/set_ftrace_filter");
    let mut file = fs.open(&filter, OpenFlags::TRUNCATE).unwrap();
    file.write(b"fsel_al").unwrap();
    file.write(b"pha fsel_gam").unwrap();
    // Nothing is visible before the close.
    assert_eq!(read(&filter), "#### all functions enabled ####\n");
    file.write(b"ma").unwrap();
    drop(file);
    assert_eq!(names(&read(&filter)), ["fsel_alpha", "fsel_gamma"]);
    fs.rmdir(&dir).unwrap();
}

#[test]
fn an_index_names_a_line_of_available_filter_functions() {
    keep_alive();
    let fs = ustrace::tracefs();
    let dir = instance("fsel_index");
    let filter = format!("{dir}/set_ftrace_filter");
    let avail = read("available_filter_functions");
    let line = avail
        .lines()
        .position(|l| l == "fsel_beta")
        .expect("fsel_beta listed")
        + 1;
    fs.write_file(&filter, &line.to_string()).unwrap();
    assert_eq!(read(&filter), "fsel_beta\n");
    assert_eq!(fs.write_file(&filter, "0\n"), Err(Errno::EINVAL));
    let past = avail.lines().count() + 1;
    assert_eq!(
        fs.write_file(&filter, &format!("{past}\n")),
        Err(Errno::EINVAL)
    );
    fs.rmdir(&dir).unwrap();
}

#[test]
fn mod_selects_by_object_and_caches_objects_not_loaded() {
    keep_alive();
    let fs = ustrace::tracefs();
    let dir = instance("fsel_mod");
    let filter = format!("{dir}/set_ftrace_filter");
    fs.write_file(&filter, "malloc:mod:libc").unwrap();
    assert_eq!(read(&filter), "malloc [libc.so.6]\n");
    // The executable is the kernel's core: not a module.
    assert_eq!(
        fs.write_file(&filter, "fsel_alpha:mod:libc\n"),
        Err(Errno::EINVAL)
    );
    fs.write_file(&filter, "fsel_alpha:mod:!").unwrap();
    assert_eq!(read(&filter), "fsel_alpha\n");
    // An object that is not loaded is remembered and listed.
    fs.write_file(&filter, "foo*:mod:libnotloaded_zz").unwrap();
    assert_eq!(
        read(&filter),
        "#### all functions enabled ####\nfoo*:mod:libnotloaded_zz\n"
    );
    fs.append_file(&filter, "!foo*:mod:libnotloaded_zz")
        .unwrap();
    assert_eq!(read(&filter), "#### all functions enabled ####\n");
    fs.rmdir(&dir).unwrap();
}

#[test]
fn graph_files_take_globs_and_refuse_removing_what_is_not_there() {
    keep_alive();
    let fs = ustrace::tracefs();
    assert_eq!(
        read("set_graph_function"),
        "#### all functions enabled ####\n"
    );
    assert_eq!(
        read("set_graph_notrace"),
        "#### no functions disabled ####\n"
    );
    fs.write_file("set_graph_function", "fsel_alpha fsel_beta")
        .unwrap();
    assert_eq!(
        names(&read("set_graph_function")),
        ["fsel_alpha", "fsel_beta"]
    );
    assert_eq!(
        fs.append_file("set_graph_function", "!fsel_gamma\n"),
        Err(Errno::EINVAL)
    );
    fs.append_file("set_graph_function", "!fsel_alpha").unwrap();
    assert_eq!(read("set_graph_function"), "fsel_beta\n");
    // No commands in the graph files.
    assert_eq!(
        fs.append_file("set_graph_function", "fsel_alpha:mod:libc\n"),
        Err(Errno::EINVAL)
    );
    fs.write_file("set_graph_function", "").unwrap();
    fs.write_file("set_graph_notrace", "fsel_gamma").unwrap();
    assert_eq!(read("set_graph_notrace"), "fsel_gamma\n");
    fs.write_file("set_graph_notrace", "").unwrap();
    // Only the top level has them.
    let dir = instance("fsel_graph");
    assert_eq!(
        fs.read_to_string(&format!("{dir}/set_graph_function")),
        Err(Errno::ENOENT)
    );
    fs.rmdir(&dir).unwrap();
}

struct Counting {
    calls: Mutex<Vec<(String, Option<String>, usize)>>,
}

impl FunctionCommand for Counting {
    fn apply(&self, call: &mut CommandCall<'_>) -> Result<(), Errno> {
        let n = call.matching().len();
        if n == 0 {
            return Err(Errno::EINVAL);
        }
        self.calls
            .lock()
            .unwrap()
            .push((call.glob.to_string(), call.param.map(str::to_string), n));
        Ok(())
    }
    fn listing(&self, _instance: &Arc<ustrace::trace::Instance>) -> String {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|(g, p, _)| format!("{g}:fselcount:{}\n", p.as_deref().unwrap_or("unlimited")))
            .collect()
    }
}

#[test]
fn commands_go_to_the_registry_and_unknown_ones_fail() {
    keep_alive();
    let fs = ustrace::tracefs();
    let dir = instance("fsel_cmd");
    let filter = format!("{dir}/set_ftrace_filter");
    assert_eq!(
        fs.write_file(&filter, "fsel_alpha:fselcount\n"),
        Err(Errno::EINVAL)
    );
    let cmd = Arc::new(Counting {
        calls: Mutex::new(Vec::new()),
    });
    filter::register_command("fselcount", cmd.clone()).unwrap();
    assert_eq!(
        filter::register_command("fselcount", cmd.clone()),
        Err(Errno(libc::EBUSY))
    );
    fs.append_file(&filter, "fsel_delta_*:fselcount:5").unwrap();
    assert_eq!(
        cmd.calls.lock().unwrap().as_slice(),
        [("fsel_delta_*".to_string(), Some("5".to_string()), 2)]
    );
    // A command leaves the function set alone and is listed after it.
    assert_eq!(
        read(&filter),
        "#### all functions enabled ####\nfsel_delta_*:fselcount:5\n"
    );
    filter::unregister_command("fselcount").unwrap();
    fs.rmdir(&dir).unwrap();
}

#[test]
fn listeners_hear_each_committed_change_once() {
    keep_alive();
    let fs = ustrace::tracefs();
    let dir = instance("fsel_notify");
    let inst = ustrace::trace::tracing().instance("fsel_notify").unwrap();
    let heard = Arc::new(AtomicUsize::new(0));
    let h = heard.clone();
    filter::subscribe(
        &inst,
        Arc::new(move |_, kind| {
            assert_eq!(kind, SetKind::Notrace);
            h.fetch_add(1, Ordering::SeqCst);
        }),
    );
    let notrace = format!("{dir}/set_ftrace_notrace");
    fs.write_file(&notrace, "fsel_alpha fsel_beta").unwrap();
    assert_eq!(heard.load(Ordering::SeqCst), 1);
    // The same set again is no change.
    fs.write_file(&notrace, "fsel_beta fsel_alpha").unwrap();
    assert_eq!(heard.load(Ordering::SeqCst), 1);
    let set = filter::selected(&inst, SetKind::Notrace);
    assert_eq!(set.len(), 2);
    assert!(set.contains(fsel_alpha as *const () as usize));
    assert!(set.contains(fsel_beta as *const () as usize));
    fs.rmdir(&dir).unwrap();
}

#[test]
fn rust_paths_are_names_and_a_lone_colon_starts_a_command() {
    keep_alive();
    let fs = ustrace::tracefs();
    let dir = instance("fsel_paths");
    let filter = format!("{dir}/set_ftrace_filter");
    fs.write_file(&filter, "ustrace::ftrace::filter::open\n")
        .unwrap();
    assert_eq!(read(&filter), "ustrace::ftrace::filter::open\n");
    fs.write_file(&filter, "ustrace::ftrace::filter::open:mod:!\n")
        .unwrap();
    assert_eq!(read(&filter), "ustrace::ftrace::filter::open\n");
    assert_eq!(
        fs.write_file(&filter, "ustrace::ftrace::filter::open:nocommand\n"),
        Err(Errno::EINVAL)
    );
    fs.rmdir(&dir).unwrap();
}
