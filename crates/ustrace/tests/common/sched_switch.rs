//! The kernel's `sched_switch` event, shaped as its format file shows it, for the tests that
//! replay histogram.rst's scheduler examples (included with `#[path]` where needed, so other
//! test binaries do not declare it).

ustrace::trace_event! {
    pub fn sched::sched_switch(
        prev_comm: &str,
        prev_pid: i32,
        prev_prio: i32,
        prev_state: i64,
        next_comm: &str,
        next_pid: i32,
        next_prio: i32
    ) {
        prev_comm: ustrace::FixedStr<16> = ustrace::FixedStr::new(prev_comm),
        prev_pid: i32 = prev_pid,
        prev_prio: i32 = prev_prio,
        prev_state: i64 = prev_state,
        next_comm: ustrace::FixedStr<16> = ustrace::FixedStr::new(next_comm),
        next_pid: i32 = next_pid,
        next_prio: i32 = next_prio,
    }
    print "prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%ld ==> next_comm=%s next_pid=%d next_prio=%d",
        prev_comm, prev_pid, prev_prio, prev_state, next_comm, next_pid, next_prio;
}
