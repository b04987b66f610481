//! With ustrace the only subscriber (`ustrace_tracing::subscriber()`), a callsite costs nothing while its event is off:
//! `tracing`'s cached interest is `never`, becomes `always` when an instance enables the
//! event from tracefs, and `never` again when it is disabled.

use tracing_core::callsite::DefaultCallsite;
use tracing_core::field::Value;
use tracing_core::{Kind, Level, Metadata};
use ustrace::{FileSystem, OpenFlags};

static META: Metadata<'static> = tracing_core::metadata! {
    name: "probe_site",
    target: "interest::probe",
    level: Level::INFO,
    fields: &["n"],
    callsite: &CALLSITE,
    kind: Kind::EVENT,
};
static CALLSITE: DefaultCallsite = DefaultCallsite::new(&META);

fn read(path: &str) -> String {
    let mut file = ustrace::tracefs().open(path, OpenFlags::READ).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = file.read(&mut buf, None).unwrap();
        if n == 0 {
            return String::from_utf8_lossy(&out).into_owned();
        }
        out.extend_from_slice(&buf[..n]);
    }
}

fn write(path: &str, text: &str) {
    let mut file = ustrace::tracefs().open(path, OpenFlags::TRUNCATE).unwrap();
    file.write(text.as_bytes()).unwrap();
}

/// What the callsite macros do: ask the cached interest, dispatch when not `never`.
fn hit(n: u64) {
    if CALLSITE.interest().is_never() {
        return;
    }
    let field = META.fields().field("n").unwrap();
    let values = [(&field, Some(&n as &dyn Value))];
    tracing_core::Event::dispatch(&META, &META.fields().value_set(&values));
}

#[test]
fn interest_follows_the_enable_file() {
    tracing_core::dispatcher::set_global_default(tracing_core::Dispatch::new(
        ustrace_tracing::subscriber(),
    ))
    .unwrap();
    assert!(
        CALLSITE.interest().is_never(),
        "off before anything is enabled"
    );
    assert!(read("available_events").contains("interest_probe:probe_site\n"));
    ustrace::tracefs().mkdir("instances/interest").unwrap();
    hit(1);
    write(
        "instances/interest/events/interest_probe/probe_site/enable",
        "1",
    );
    assert!(
        CALLSITE.interest().is_always(),
        "enabling rebuilds the interest"
    );
    hit(2);
    write(
        "instances/interest/events/interest_probe/probe_site/enable",
        "0",
    );
    assert!(
        CALLSITE.interest().is_never(),
        "disabling makes it never again"
    );
    hit(3);
    let trace = read("instances/interest/trace");
    let lines: Vec<&str> = trace.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 1, "{trace}");
    assert!(lines[0].ends_with("probe_site: INFO n=2"), "{}", lines[0]);
    ustrace::tracefs().rmdir("instances/interest").unwrap();
}
