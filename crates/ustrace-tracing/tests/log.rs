//! `log` records, through `tracing-log`'s `LogTracer`, as events of their target.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use ustrace::{FileSystem, OpenFlags};

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

fn lines(path: &str) -> Vec<String> {
    read(path)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(String::from)
        .collect()
}

#[test]
fn log_records_are_events_of_their_target() {
    tracing_subscriber::registry()
        .with(ustrace_tracing::layer())
        .init();
    tracing_log::LogTracer::init().unwrap();
    log::info!(target: "legacy::db", "query {} took {}", 1, 2);
    log::warn!(target: "legacy-http", "slow");
    let available = read("available_events");
    for event in ["legacy_db:log", "legacy_http:log"] {
        assert!(
            available.lines().any(|l| l == event),
            "{event} missing:\n{available}"
        );
    }
    ustrace::tracefs().mkdir("instances/logs").unwrap();
    write(
        "instances/logs/events/legacy_db/log/filter",
        "level <= 3 && message ~ \"query*\"",
    );
    write("instances/logs/events/legacy_db/log/enable", "1");
    log::info!(target: "legacy::db", "query {} took {}", 3, 4);
    log::info!(target: "legacy::db", "connected");
    log::debug!(target: "legacy::db", "query at debug");
    log::warn!(target: "legacy-http", "not enabled");
    let got = lines("instances/logs/trace");
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(
        got[0].contains("log: INFO query 3 took 4 log_target=legacy::db log_module_path=log "),
        "{}",
        got[0]
    );
    write("instances/logs/events/legacy_db/log/enable", "0");
    log::info!(target: "legacy::db", "query after");
    assert_eq!(lines("instances/logs/trace").len(), 1);
    ustrace::tracefs().rmdir("instances/logs").unwrap();

    // A new target's first record logged inside an RCU read-side section (as from a
    // tracepoint probe) cannot wait for the grace period registering needs: it is dropped,
    // and the next record registers the target.
    {
        let _reader = ustrace::rcu::read_lock();
        log::info!(target: "inside::rcu", "first");
    }
    assert!(!read("available_events").contains("inside_rcu:log\n"));
    log::info!(target: "inside::rcu", "second");
    assert!(read("available_events").contains("inside_rcu:log\n"));
}
