//! A crate that forbids unsafe code can still declare and fire events: what `trace_event!`
//! expands to in the caller's crate must not trip `unsafe_code` (this file does not build
//! otherwise).
#![forbid(unsafe_code)]

mod common;

ustrace::trace_event! {
    /// An event of a crate that forbids unsafe code.
    pub fn safe_only::ping(n: u64, who: &str) {
        n: u64 = n,
        who: &str = who,
    }
    print "n=%llu who=%s", n, who;
}

#[test]
fn events_of_a_crate_that_forbids_unsafe_code_are_recorded() {
    common::write("events/safe_only/ping/filter", "n > 1\n").unwrap();
    common::write("events/safe_only/ping/enable", "1\n").unwrap();
    common::write("trace", "").unwrap();
    for n in 0..4 {
        ping::trace(n, "safe");
    }
    common::write("events/safe_only/ping/enable", "0\n").unwrap();
    let lines = common::body_lines(&common::read("trace").unwrap());
    let pings: Vec<&String> = lines.iter().filter(|l| l.contains("ping: ")).collect();
    assert_eq!(pings.len(), 2, "{lines:#?}");
    assert!(pings[0].ends_with("ping: n=2 who=safe"), "{lines:#?}");
}
