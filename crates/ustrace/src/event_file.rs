//! One event in one instance: the kernel's `struct trace_event_file`, and the record path.
//!
//! An [`EventFile`] holds what an instance decides about one event (enabled, soft mode, its
//! filter, its triggers) in one flag word and RCU-published programs, and writes the event's
//! records into the instance's buffers. The hot path is [`EventFile::record`]: read the flags
//! (one relaxed load), reserve in the buffer of the current CPU, write the common header and
//! the fields, commit; a filtered or conditionally triggered record is built aside and handed
//! to the per-event stages ([`crate::stage`]) first.
//!
//! It stands below the instances that own it ([`crate::trace`]) and below the events that
//! feed it: an event is seen here only as an [`EventSource`] (its names, its fields, and how to
//! attach its probe to this file), which the registry's events implement, so the record path
//! knows neither the registry nor the instance.

use std::any::Any;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use ustrace_ctl::vfs::Errno;

use crate::buffers::Shared;
use crate::event::field::FieldDesc;
use crate::event::id::{EventId, USER_STACK_ID};
use crate::rcu::RcuCell;
use crate::stage::trigger::{self as trigger_stage, Registered, SoftSwitch};
use crate::thread;

/// Stops feeding an event file; returned by [`EventSource::attach`].
pub trait Attachment: Send + Sync {
    /// Stops the records; after it returns no new record reaches the file.
    fn detach(self: Box<Self>);
}

/// An event as its files see it: names and fields for the files' text and programs, and
/// how to connect the code that produces its records to a file.
pub trait EventSource: Send + Sync {
    /// The id records carry (`common_type`) and the `id` file shows.
    fn id(&self) -> EventId;
    /// The system (`kv` in `kv:get`).
    fn system(&self) -> &str;
    /// The event's name (`get` in `kv:get`).
    fn name(&self) -> &str;
    /// The crate that declared the event (`set_event`'s `:mod:`), if any.
    fn module(&self) -> Option<&str>;
    /// Common fields followed by the event's own: what filters, triggers and hists may name.
    fn all_fields(&self) -> Vec<FieldDesc>;
    /// The text of the event's `format` file.
    fn format_file(&self) -> String;
    /// Starts producing records into `file`.
    fn attach(&self, file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno>;
}

/// `EventFile::flags` bits, as the kernel's `EVENT_FILE_FL_*`.
mod flag {
    /// The probe is attached.
    pub const ENABLED: u32 = 1 << 0;
    /// Attached, but records are not kept (triggers still run).
    pub const SOFT_DISABLED: u32 = 1 << 1;
    /// Triggers (of this or other events) hold the probe attached.
    pub const SOFT_MODE: u32 = 1 << 2;
    /// A filter program is published.
    pub const FILTERED: u32 = 1 << 3;
    /// The event has triggers.
    pub const TRIGGER_MODE: u32 = 1 << 4;
    /// Some trigger has a filter, so triggers run on the built record.
    pub const TRIGGER_COND: u32 = 1 << 5;
    /// The instance filters by thread id.
    pub const PID_FILTER: u32 = 1 << 6;
    /// The instance's `stacktrace` option: a `kernel_stack` entry follows each record.
    pub const STACKTRACE: u32 = 1 << 7;
    /// The instance's `userstacktrace` option: a `user_stack` entry follows each record.
    pub const USERSTACK: u32 = 1 << 8;
    /// Either stack option: records take the out-of-line path, which adds the entries.
    pub const STACKS: u32 = STACKTRACE | USERSTACK;
    /// `tracing_cpumask` leaves some CPU out, so records are checked aside first.
    pub const CPU_MASK: u32 = 1 << 9;
}

/// One event in one instance: whether it records, its filter, its triggers.
pub struct EventFile {
    /// The event this file records.
    pub event: Arc<dyn EventSource>,
    /// The instance that owns the file, which this floor does not know by type (eprobes
    /// find their source event's instance through it: [`crate::trace::instance_of`]).
    pub(crate) owner: Weak<dyn Any + Send + Sync>,
    id: u16,
    flags: AtomicU32,
    pub(crate) shared: Arc<Shared>,
    control: Mutex<Control>,
    pub(crate) filter: RcuCell<crate::stage::filter::Compiled>,
    /// What the `filter` file shows; `None` shows `none`.
    pub(crate) filter_text: Mutex<Option<String>>,
    pub(crate) triggers: crate::stage::trigger::Triggers,
    pub(crate) trigger_list: Mutex<Vec<Arc<Registered>>>,
}

#[derive(Default)]
struct Control {
    attachment: Option<Box<dyn Attachment>>,
    /// How many triggers hold this event in soft mode.
    soft_refs: usize,
}

/// The flags that leave a filtered record to its filter alone: the checks they stand for ran
/// before the record was built ([`EventFile::wants_record`]). Any other flag, including
/// flags added later, sends the record through [`EventFile::record_checked`].
const FILTER_ONLY: u32 = flag::ENABLED | flag::SOFT_MODE | flag::TRIGGER_MODE | flag::PID_FILTER;

/// Largest record the filter-only path builds on the stack (larger ones use the scratch
/// buffer): room for the common header and seven 8-byte fields, zeroed in four stores.
const STACK_RECORD_SIZE: usize = 64;

/// Largest record built in the per-thread scratch buffer before it is kept.
const SCRATCH_SIZE: usize = 4096;

thread_local! {
    /// Where filtered, soft-disabled and conditionally triggered records are built, so a
    /// record that is not kept never touches the ring buffer (the kernel's buffered event).
    static SCRATCH: std::cell::RefCell<[u8; SCRATCH_SIZE]> =
        const { std::cell::RefCell::new([0; SCRATCH_SIZE]) };
}

impl EventFile {
    /// A file for `event` that records into `shared`: off, unfiltered, without triggers.
    pub(crate) fn new(
        event: Arc<dyn EventSource>,
        owner: Weak<dyn Any + Send + Sync>,
        shared: Arc<Shared>,
    ) -> EventFile {
        EventFile {
            id: event.id().0,
            event,
            owner,
            flags: AtomicU32::new(0),
            shared,
            control: Mutex::new(Control::default()),
            filter: RcuCell::empty(),
            filter_text: Mutex::new(None),
            triggers: RcuCell::empty(),
            trigger_list: Mutex::new(Vec::new()),
        }
    }

    /// Whether the probe should build a record at all. Runs unconditional triggers, and says
    /// no while soft-disabled or when the thread is filtered out, as the kernel's
    /// `trace_trigger_soft_disabled` and pid check.
    #[inline(always)]
    pub fn wants_record(&self) -> bool {
        let flags = self.flags.load(Ordering::Relaxed);
        if flags & (flag::TRIGGER_MODE | flag::SOFT_DISABLED | flag::PID_FILTER) == 0 {
            return true;
        }
        self.wants_record_slow(flags)
    }

    #[cold]
    #[inline(never)]
    fn wants_record_slow(&self, flags: u32) -> bool {
        if flags & flag::TRIGGER_COND != 0 {
            // Conditional triggers need the record; the pid filter still applies.
            return !(flags & flag::PID_FILTER != 0 && self.shared.ignores_current_thread());
        }
        if flags & flag::TRIGGER_MODE != 0 {
            let fired = trigger_stage::evaluate(&self.triggers, &self.shared, None);
            trigger_stage::run_actions(&self.triggers, &self.shared, fired);
        }
        if flags & flag::SOFT_DISABLED != 0 {
            return false;
        }
        !(flags & flag::PID_FILTER != 0 && self.shared.ignores_current_thread())
    }

    /// The direct path, when the event needs no check now (one relaxed load), for a
    /// producer that is not a tracepoint probe (probes ask [`EventFile::probe_path`]).
    /// `None` means: ask [`EventFile::wants_record`], then [`EventFile::record`].
    #[inline(always)]
    pub fn direct(&self) -> Option<Direct<'_>> {
        // Every flag but these needs a check, flags added later included.
        let flags = self.flags.load(Ordering::Relaxed);
        (flags & !(flag::ENABLED | flag::SOFT_MODE) == 0).then_some(Direct(self))
    }

    /// Which record path a probe takes now (one relaxed load): [`Direct`] when the event
    /// needs no check, [`Filtered`] when its only check is its filter, else
    /// [`ProbePath::Checked`] (ask [`EventFile::checked`]). What a probe tests first, so
    /// that each path is a tail call with the arguments still in registers.
    ///
    /// # Safety
    /// Only a tracepoint probe may call it (as `trace_event!`'s do), inside the read-side
    /// section of the tracepoint's call, and use what it returns only there: the
    /// [`Filtered`] path reads the filter without a section of its own.
    #[doc(hidden)]
    #[inline(always)]
    pub unsafe fn probe_path(&self) -> ProbePath<'_> {
        let flags = self.flags.load(Ordering::Relaxed) & !(flag::ENABLED | flag::SOFT_MODE);
        // Every flag but these needs a check, flags added later included.
        if flags == 0 {
            return ProbePath::Direct(Direct(self));
        }
        // Laid out after the direct path, so that it is tested first and pays for no other
        // test (the paths below are tail calls either way).
        not_direct();
        if flags == flag::FILTERED {
            ProbePath::Filtered(Filtered(self))
        } else {
            ProbePath::Checked
        }
    }

    /// The record path for a probe that was refused [`EventFile::direct`], when
    /// [`EventFile::wants_record`] has nothing to do (no triggers but conditional ones, no
    /// pid filter, not soft-disabled unless conditional triggers need the record): one
    /// relaxed load. `None`: ask [`EventFile::wanted`].
    #[inline(always)]
    pub fn checked(&self) -> Option<Checked<'_>> {
        // The flags `wants_record` passes over; any other (flags added later included)
        // sends the probe through `wanted`. Conditional triggers leave it nothing to do
        // either, soft-disabled or not (they run on the built record, which the record
        // path then drops): an eprobe's source event, a hist trigger's event.
        const PASSED: u32 =
            flag::ENABLED | flag::SOFT_MODE | flag::FILTERED | flag::STACKS | flag::CPU_MASK;
        const CONDITIONAL: u32 = flag::TRIGGER_MODE | flag::TRIGGER_COND;
        let rest = self.flags.load(Ordering::Relaxed) & !PASSED;
        (rest == 0 || rest & !flag::SOFT_DISABLED == CONDITIONAL).then_some(Checked(self))
    }

    /// [`EventFile::wants_record`], and the record path if it says yes.
    #[inline(always)]
    pub fn wanted(&self) -> Option<Checked<'_>> {
        self.wants_record().then_some(Checked(self))
    }

    /// Writes one record: the common header, then `fill` writes the fields. Unfiltered
    /// events reserve in the buffer directly; filtered ones are built aside first. No lock,
    /// no allocation, no syscall.
    #[inline(always)]
    pub fn record(&self, len: usize, fill: impl FnOnce(&mut [u8])) {
        let flags = self.flags.load(Ordering::Relaxed);
        if flags
            & (flag::FILTERED
                | flag::TRIGGER_COND
                | flag::SOFT_DISABLED
                | flag::STACKS
                | flag::CPU_MASK)
            != 0
        {
            if flags & !FILTER_ONLY == flag::FILTERED {
                return self.record_filtered(len, flags, fill);
            }
            return self.record_checked(len, flags, fill, |_| {});
        }
        self.record_direct(len, fill);
    }

    /// Records for a producer that is not a probe and is never soft-disabled (`trace_marker`),
    /// running the event's triggers as a probe would.
    /// `finish` completes the record after the triggers saw it (the marker's newline,
    /// which the kernel adds only after running the triggers).
    pub(crate) fn record_always(
        &self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
        finish: impl FnOnce(&mut [u8]),
    ) {
        // The kernel adds no stack entries after a `trace_marker` write.
        let mut flags = self.flags.load(Ordering::Relaxed) & !(flag::SOFT_DISABLED | flag::STACKS);
        if flags & flag::TRIGGER_MODE != 0 {
            // The kernel runs the marker's triggers on the reserved entry, so even a
            // `traceoff` keeps the marker that fired it.
            flags |= flag::TRIGGER_COND;
        }
        if flags & (flag::FILTERED | flag::TRIGGER_COND | flag::CPU_MASK) != 0 {
            return self.record_checked(len, flags, fill, finish);
        }
        self.record_direct(len, |record| {
            fill(record);
            finish(record);
        });
    }

    /// Reserves in the buffer, writes header and fields, commits: the unfiltered path.
    #[inline(always)]
    fn record_direct(&self, len: usize, fill: impl FnOnce(&mut [u8])) {
        let header = crate::event::field::common_header(
            self.id,
            thread::current_tid(&self.shared.record_cmd),
        );
        let Some(mut slot) = self.shared.buffer.reserve(len) else {
            return;
        };
        let record: &mut [u8] = &mut slot;
        record[..8].copy_from_slice(&header);
        fill(record);
        slot.commit();
    }

    #[inline(never)]
    fn record_direct_out_of_line(&self, len: usize, fill: impl FnOnce(&mut [u8])) {
        self.record_direct(len, fill);
    }

    #[inline(always)]
    fn write_header(&self, record: &mut [u8], pid: i32) {
        crate::event::field::write_common_header(record, self.id, pid);
    }

    /// The record path of an event whose only check is its filter (`flags & !FILTER_ONLY`
    /// is `FILTERED`), the common case: build the record on the stack, run the filter
    /// inline, and write it to the buffer only if it passes. A rejected record costs no
    /// timestamp, no reservation and no thread-local scratch; a signal handler that traces
    /// meanwhile builds its record in its own frame. A record too large for the stack buffer
    /// goes to [`EventFile::record_checked`].
    #[inline(never)]
    fn record_filtered(&self, len: usize, flags: u32, fill: impl FnOnce(&mut [u8])) {
        debug_assert_eq!(flags & !FILTER_ONLY, flag::FILTERED);
        if len > STACK_RECORD_SIZE {
            return self.record_checked(len, flags, fill, |_| {});
        }
        let mut buf = [0u8; STACK_RECORD_SIZE];
        // Into the whole buffer, whose size is known, so the header needs no length check.
        self.write_header(&mut buf, thread::current_tid(&self.shared.record_cmd));
        let record = &mut buf[..len];
        fill(record);
        let keep = {
            let guard = crate::rcu::read_lock();
            // Unpublished between the flag load and here: the record is kept, as with a
            // filter removed a moment earlier.
            self.filter
                .get(&guard)
                .is_none_or(|program| program.matches(record))
        };
        if keep {
            self.shared.buffer.write(record);
        }
    }

    /// [`Filtered::record`] for a filter that needs the header or its context: writes the
    /// header, runs the whole filter, writes the record if it passes.
    #[inline(never)]
    fn filter_with_header(&self, program: &crate::stage::filter::Compiled, record: &mut [u8]) {
        self.write_header(record, thread::current_tid(&self.shared.record_cmd));
        if program.matches(record) {
            self.shared.buffer.write(record);
        }
    }

    /// Writes a record [`Filtered::record`] built and kept: its header, then the record
    /// into the buffer. Out of line, so that a rejected record's frame stays small.
    #[inline(never)]
    fn write_kept(&self, record: &mut [u8]) {
        self.write_header(record, thread::current_tid(&self.shared.record_cmd));
        self.shared.buffer.write(record);
    }

    /// The record path when a filter or conditional triggers must see the record before it
    /// is kept: build it aside (on the stack up to [`STACK_RECORD_SIZE`] bytes, else in the
    /// thread's scratch buffer), decide, copy what is kept.
    #[inline(never)]
    fn record_checked(
        &self,
        len: usize,
        flags: u32,
        fill: impl FnOnce(&mut [u8]),
        finish: impl FnOnce(&mut [u8]),
    ) {
        let pid = thread::current_tid(&self.shared.record_cmd);
        // A record nothing can reject (only triggers look at it) is reserved in place
        // before its triggers run, as the kernel reserves it: what a record hook writes
        // (an eprobe on this event) comes after it, and nothing is copied. When it cannot
        // be reserved (tracing off, or a full buffer that counted the drop) the triggers
        // still see it, built aside, and it is not written again.
        let mut write_kept = true;
        if flags & (flag::SOFT_DISABLED | flag::CPU_MASK | flag::FILTERED) == 0 {
            if let Some(slot) = self.shared.buffer.reserve(len) {
                self.record_in_place(slot, pid, flags, fill, finish);
                return;
            }
            write_kept = false;
        }
        if len <= STACK_RECORD_SIZE {
            // A small record (a hist trigger's key event, most events) is built in this
            // frame: no thread-local to reach, nothing to borrow.
            let mut buf = [0u8; STACK_RECORD_SIZE];
            self.write_header(&mut buf, pid);
            let record = &mut buf[..len];
            fill(record);
            let (keep, fired) = self.decide(flags, record);
            finish(record);
            let kept = keep && write_kept && self.shared.buffer.write(record);
            if kept && flags & flag::STACKS != 0 {
                record_stacks(&self.shared, flags, pid);
            }
            trigger_stage::run_actions(&self.triggers, &self.shared, fired);
            return;
        }
        let mut fill = Some(fill);
        let mut finish = Some(finish);
        let built = SCRATCH.try_with(|scratch| {
            // A signal handler tracing while this thread builds a record finds the scratch
            // buffer busy and records directly instead.
            let Ok(mut scratch) = scratch.try_borrow_mut() else {
                return None;
            };
            if len > SCRATCH_SIZE {
                return None;
            }
            let record = &mut scratch[..len];
            self.write_header(record, pid);
            (fill.take().expect("fill used once"))(record);
            let (keep, fired) = self.decide(flags, record);
            (finish.take().expect("finish used once"))(record);
            let kept = keep && write_kept && self.shared.buffer.write(record);
            Some((kept, fired))
        });
        if let Ok(Some((kept, fired))) = built {
            // Outside the closure, so the stack starts at the same depth on both paths.
            if kept && flags & flag::STACKS != 0 {
                record_stacks(&self.shared, flags, pid);
            }
            trigger_stage::run_actions(&self.triggers, &self.shared, fired);
            return;
        }
        let (Some(fill), Some(finish)) = (fill.take(), finish.take()) else {
            return;
        };
        if !write_kept {
            return;
        }
        let Some(slot) = self.shared.buffer.reserve(len) else {
            return;
        };
        self.record_in_place(slot, pid, flags, fill, finish);
    }

    /// Builds a record in its reserved slot, runs its triggers on it, and commits or
    /// discards it as they decide.
    #[inline(always)]
    fn record_in_place(
        &self,
        mut slot: ustrace_ringbuf::Reservation<'_>,
        pid: i32,
        flags: u32,
        fill: impl FnOnce(&mut [u8]),
        finish: impl FnOnce(&mut [u8]),
    ) {
        let record: &mut [u8] = &mut slot;
        self.write_header(record, pid);
        fill(record);
        let (keep, fired) = self.decide(flags, record);
        finish(record);
        if keep {
            slot.commit();
            if flags & flag::STACKS != 0 {
                record_stacks(&self.shared, flags, pid);
            }
        } else {
            slot.discard();
        }
        trigger_stage::run_actions(&self.triggers, &self.shared, fired);
    }

    /// Runs conditional triggers on `record`; says whether the record is kept (not
    /// soft-disabled, passes the filter) and which triggers fired.
    #[inline]
    fn decide(&self, flags: u32, record: &[u8]) -> (bool, u64) {
        let fired = if flags & flag::TRIGGER_COND != 0 {
            trigger_stage::evaluate(&self.triggers, &self.shared, Some(record))
        } else {
            0
        };
        if flags & flag::SOFT_DISABLED != 0 {
            return (false, fired);
        }
        if flags & flag::CPU_MASK != 0 && !self.shared.cpumask.allows_current() {
            return (false, fired);
        }
        if flags & flag::FILTERED != 0 {
            let guard = crate::rcu::read_lock();
            if let Some(program) = self.filter.get(&guard) {
                if !program.matches(record) {
                    return (false, fired);
                }
            }
        }
        (true, fired)
    }

    /// The `enable` file's text: `1` when recording, `0` otherwise, `*` in soft mode.
    pub fn enable_text(&self) -> &'static str {
        let flags = self.flags.load(Ordering::Relaxed);
        let on = flags & flag::ENABLED != 0 && flags & flag::SOFT_DISABLED == 0;
        let soft = flags & (flag::SOFT_MODE | flag::SOFT_DISABLED) != 0;
        match (on, soft) {
            (false, false) => "0\n",
            (true, false) => "1\n",
            (false, true) => "0*\n",
            (true, true) => "1*\n",
        }
    }

    /// Whether the event records (enabled and not soft-disabled).
    pub fn is_enabled(&self) -> bool {
        let flags = self.flags.load(Ordering::Relaxed);
        flags & flag::ENABLED != 0 && flags & flag::SOFT_DISABLED == 0
    }

    /// Whether the event is soft-disabled (attached, but records nothing until a trigger
    /// enables it).
    pub fn is_soft_disabled(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & flag::SOFT_DISABLED != 0
    }

    /// Turns recording on or off (the `enable` file). Off while triggers hold the event in
    /// soft mode keeps the probe attached, soft-disabled.
    pub fn set_enabled(self: &Arc<Self>, on: bool) -> Result<(), Errno> {
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        if on {
            self.ensure_attached(&mut control)?;
            self.flags.fetch_or(flag::ENABLED, Ordering::Relaxed);
            self.flags
                .fetch_and(!flag::SOFT_DISABLED, Ordering::Relaxed);
        } else if control.soft_refs > 0 {
            self.flags.fetch_or(flag::SOFT_DISABLED, Ordering::Relaxed);
        } else {
            self.flags
                .fetch_and(!(flag::ENABLED | flag::SOFT_DISABLED), Ordering::Relaxed);
            if let Some(attachment) = control.attachment.take() {
                attachment.detach();
            }
        }
        Ok(())
    }

    /// Holds the probe attached for triggers (soft mode); an event that was off stays
    /// soft-disabled.
    pub fn soft_mode_get(self: &Arc<Self>) -> Result<(), Errno> {
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        if control.soft_refs == 0 {
            if self.flags.load(Ordering::Relaxed) & flag::ENABLED == 0 {
                self.ensure_attached(&mut control)?;
                self.flags
                    .fetch_or(flag::ENABLED | flag::SOFT_DISABLED, Ordering::Relaxed);
            }
            self.flags.fetch_or(flag::SOFT_MODE, Ordering::Relaxed);
        }
        control.soft_refs += 1;
        Ok(())
    }

    /// Releases one soft-mode hold. When the last goes, an event that was soft-disabled is
    /// turned off; one that a trigger had enabled stays enabled, as on the kernel.
    pub fn soft_mode_put(&self) {
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        control.soft_refs = control.soft_refs.saturating_sub(1);
        if control.soft_refs > 0 {
            return;
        }
        let flags = self.flags.fetch_and(!flag::SOFT_MODE, Ordering::Relaxed);
        if flags & flag::SOFT_DISABLED != 0 {
            self.flags
                .fetch_and(!(flag::ENABLED | flag::SOFT_DISABLED), Ordering::Relaxed);
            if let Some(attachment) = control.attachment.take() {
                attachment.detach();
            }
        }
    }

    /// What an `enable_event`/`disable_event` trigger flips.
    pub fn set_soft_disabled(&self, disabled: bool) {
        if disabled {
            self.flags.fetch_or(flag::SOFT_DISABLED, Ordering::Relaxed);
        } else {
            self.flags
                .fetch_and(!flag::SOFT_DISABLED, Ordering::Relaxed);
        }
    }

    /// Publishes a filter program (or none) and the text `filter` shows.
    pub(crate) fn set_filter(
        &self,
        program: Option<crate::stage::filter::Compiled>,
        text: Option<String>,
    ) {
        let on = program.is_some();
        if !on {
            self.flags.fetch_and(!flag::FILTERED, Ordering::Relaxed);
        }
        self.filter.replace(program);
        if on {
            self.flags.fetch_or(flag::FILTERED, Ordering::Relaxed);
        }
        self.set_filter_text(text);
    }

    pub(crate) fn set_filter_text(&self, text: Option<String>) {
        *self.filter_text.lock().unwrap_or_else(|e| e.into_inner()) = text;
    }

    pub(crate) fn set_trigger_flags(&self, any: bool, conditional: bool) {
        let set = |bit: u32, on: bool| {
            if on {
                self.flags.fetch_or(bit, Ordering::Relaxed);
            } else {
                self.flags.fetch_and(!bit, Ordering::Relaxed);
            }
        };
        set(flag::TRIGGER_MODE, any);
        set(flag::TRIGGER_COND, conditional);
    }

    /// Mirrors the instance's `stacktrace` and `userstacktrace` options into the flag word.
    pub(crate) fn set_stack_options(&self, kernel: bool, user: bool) {
        for (bit, on) in [(flag::STACKTRACE, kernel), (flag::USERSTACK, user)] {
            if on {
                self.flags.fetch_or(bit, Ordering::Relaxed);
            } else {
                self.flags.fetch_and(!bit, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn set_cpu_masked(&self, on: bool) {
        if on {
            self.flags.fetch_or(flag::CPU_MASK, Ordering::Relaxed);
        } else {
            self.flags.fetch_and(!flag::CPU_MASK, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_pid_filter(&self, on: bool) {
        if on {
            self.flags.fetch_or(flag::PID_FILTER, Ordering::Relaxed);
        } else {
            self.flags.fetch_and(!flag::PID_FILTER, Ordering::Relaxed);
        }
    }

    /// Publishes the registered triggers to the record path and sets the flags that send
    /// records through them.
    pub(crate) fn publish_triggers(&self, list: &[Arc<Registered>]) {
        // Hist triggers need the record, as the kernel's EVENT_CMD_FL_NEEDS_REC.
        let conditional = list
            .iter()
            .any(|t| t.filter.is_some() || t.hook.is_some() || t.hist.is_some());
        self.set_trigger_flags(!list.is_empty(), conditional);
        self.triggers.replace(if list.is_empty() {
            None
        } else {
            Some(list.to_vec())
        });
    }

    /// Removes every trigger but the record hooks (which belong to the dynamic events that
    /// added them, and are removed by those), giving back the soft-mode holds they took.
    pub(crate) fn clear_triggers(self: &Arc<Self>) {
        let removed: Vec<_> = {
            let mut list = self.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
            let (hooks, removed): (Vec<_>, Vec<_>) = std::mem::take(&mut *list)
                .into_iter()
                .partition(|t| t.hook.is_some());
            *list = hooks;
            self.publish_triggers(&list);
            removed
        };
        for trigger in removed {
            if let Some(target) = &trigger.target {
                target.release_soft_mode();
            }
            self.soft_mode_put();
            // A hist trigger going with its event or instance gives back the variable
            // references, synthetic events and hidden triggers it held, as `!hist` does.
            if let Some(h) = &trigger.hist {
                crate::trigger::serialized(|| crate::hist_inter::detach(&h.hist));
            }
        }
    }

    fn ensure_attached(self: &Arc<Self>, control: &mut Control) -> Result<(), Errno> {
        if control.attachment.is_none() {
            control.attachment = Some(self.event.attach(self.clone())?);
        }
        Ok(())
    }

    pub(crate) fn detach_all(self: &Arc<Self>) {
        self.clear_triggers();
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        self.flags.store(0, Ordering::Relaxed);
        control.soft_refs = 0;
        if let Some(attachment) = control.attachment.take() {
            attachment.detach();
        }
    }
}

impl SoftSwitch for EventFile {
    fn is_soft_disabled(&self) -> bool {
        EventFile::is_soft_disabled(self)
    }

    fn set_soft_disabled(&self, disabled: bool) {
        EventFile::set_soft_disabled(self, disabled)
    }

    fn release_soft_mode(&self) {
        self.soft_mode_put()
    }

    fn set_hist_paused(&self, paused: bool) {
        let guard = crate::rcu::read_lock();
        if let Some(list) = self.triggers.get(&guard) {
            for hist in list.iter().filter_map(|t| t.hist.as_ref()) {
                hist.paused.store(paused, Ordering::Relaxed);
            }
        }
    }
}

/// An event file that needed no check when its flags were read ([`EventFile::direct`]).
pub struct Direct<'a>(&'a EventFile);

/// An event file whose [`EventFile::wants_record`] said yes, recorded through paths that
/// are all out of line ([`EventFile::checked`]), so that the probe that holds it needs
/// only a small frame.
pub struct Checked<'a>(&'a EventFile);

impl Checked<'_> {
    /// As [`EventFile::record`].
    #[inline(always)]
    pub fn record(self, len: usize, fill: impl FnOnce(&mut [u8])) {
        let file = self.0;
        let flags = file.flags.load(Ordering::Relaxed);
        // Called here, not from `record_filtered`, so that `record_checked` is always
        // called from the probe (`record_stacks` skips a fixed number of frames).
        match flags & !FILTER_ONLY {
            0 => file.record_direct_out_of_line(len, fill),
            flag::FILTERED => file.record_filtered(len, flags, fill),
            _ => file.record_checked(len, flags, fill, |_| {}),
        }
    }
}

/// Marks the branch that calls it as the unlikely one (`std::hint::cold_path`, which is
/// newer than this crate's minimum Rust).
#[cold]
#[inline]
fn not_direct() {}

/// What [`EventFile::probe_path`] found.
pub enum ProbePath<'a> {
    /// No check: reserve, write, commit.
    Direct(Direct<'a>),
    /// The filter is the only check.
    Filtered(Filtered<'a>),
    /// Anything else: [`EventFile::checked`], then [`EventFile::wanted`].
    Checked,
}

/// An event file whose only check was its filter when its flags were read
/// ([`EventFile::probe_path`]). Only a tracepoint probe may hold one: its record path reads
/// the filter inside the read-side section of the tracepoint's call.
pub struct Filtered<'a>(&'a EventFile);

impl Filtered<'_> {
    /// Builds the record on the stack, runs the filter on it, and writes it only if it
    /// passes: a rejected record costs no timestamp, no reservation, no read-side section
    /// of its own, and no header when the filter reads no common field. Must be called
    /// from a tracepoint probe (inside the tracepoint's read-side section).
    #[inline(always)]
    pub fn record(self, len: usize, fill: impl FnOnce(&mut [u8])) {
        let file = self.0;
        if len > STACK_RECORD_SIZE {
            return file.record_filtered(len, flag::ENABLED | flag::FILTERED, fill);
        }
        let mut space = std::mem::MaybeUninit::<[u8; STACK_RECORD_SIZE]>::uninit();
        // SAFETY: `len <= STACK_RECORD_SIZE`, and the `len` bytes are zeroed before the slice
        // is made, so it covers initialized bytes of `space` only. Only these are zeroed: the
        // stores the fields overwrite fold away.
        let buf = unsafe {
            let at = space.as_mut_ptr().cast::<u8>();
            std::ptr::write_bytes(at, 0, len);
            std::slice::from_raw_parts_mut(at, len)
        };
        fill(buf);
        // SAFETY: a `Filtered` is made only by `probe_path`, whose caller is inside a
        // read-side section until the record is done; the program is not used after this
        // function returns.
        let program = unsafe { file.filter.get_in_section() };
        // `None`: unpublished since the flags were read; kept, as with a filter removed a
        // moment earlier.
        // Every call below is the last thing done, so no value lives across a call and the
        // probe saves no register.
        match program.map(|p| (p, p.matches_headerless(buf))) {
            None | Some((_, Some(true))) => file.write_kept(buf),
            Some((_, Some(false))) => {}
            Some((program, None)) => file.filter_with_header(program, buf),
        }
    }
}

impl Direct<'_> {
    /// Writes one record straight into the buffer: reserve, header, `fill`, commit.
    #[inline(always)]
    pub fn record(self, len: usize, fill: impl FnOnce(&mut [u8])) {
        self.0.record_direct(len, fill);
    }
}

/// Most frames a `kernel_stack` entry holds (the output prints up to this many).
pub(crate) const MAX_STACK_ENTRIES: usize = 64;
/// Frames a `user_stack` entry holds, as the kernel's fixed `caller[8]`.
pub(crate) const USER_STACK_ENTRIES: usize = 8;

/// Adds the entries the `stacktrace` and `userstacktrace` options ask for after a kept
/// record, in the kernel's order (kernel stack, then user stack). Both hold the calling
/// thread's stack from the probe that recorded the event outwards: the frames of the record
/// path itself (this function and `record_checked`) are skipped. Addresses are stored raw
/// and symbolized when the trace is read.
#[cold]
#[inline(never)]
fn record_stacks(shared: &Shared, flags: u32, pid: i32) {
    let mut frames = [0usize; MAX_STACK_ENTRIES];
    // Skipped: this function and `record_checked` (both never inlined).
    let n = ustrace_inspect::stack::capture(2, &mut frames);
    if flags & flag::STACKTRACE != 0 {
        shared.write_kernel_stack(pid, &frames[..n]);
    }
    if flags & flag::USERSTACK != 0 {
        let len = 16 + 8 * USER_STACK_ENTRIES;
        if let Some(mut slot) = shared.buffer.reserve(len) {
            let record: &mut [u8] = &mut slot;
            crate::event::field::write_common_header(record, USER_STACK_ID.0, pid);
            record[8..12].copy_from_slice(&process_id().to_ne_bytes());
            record[12..16].fill(0);
            for i in 0..USER_STACK_ENTRIES {
                // Unused slots stay 0: the reader stops at the first 0, as the kernel's.
                let addr = if i < n { frames[i] as u64 } else { 0 };
                record[16 + 8 * i..24 + 8 * i].copy_from_slice(&addr.to_ne_bytes());
            }
            slot.commit();
        }
    }
}

/// This process's id, asked of the kernel once (and again in a forked child), so that
/// recording a user stack makes no system call.
fn process_id() -> u32 {
    use std::sync::atomic::AtomicU32;
    static PID: AtomicU32 = AtomicU32::new(0);
    static ATFORK: std::sync::Once = std::sync::Once::new();
    extern "C" fn forget_in_child() {
        PID.store(0, Ordering::Relaxed);
    }
    let pid = PID.load(Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    ATFORK.call_once(|| {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(forget_in_child)) };
    });
    // SAFETY: getpid has no arguments and cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    PID.store(pid, Ordering::Relaxed);
    pid
}

/// A shared event is its event, so `&file.event` goes wherever an event is asked for.
impl<T: EventSource + ?Sized> EventSource for Arc<T> {
    fn id(&self) -> EventId {
        (**self).id()
    }
    fn system(&self) -> &str {
        (**self).system()
    }
    fn name(&self) -> &str {
        (**self).name()
    }
    fn module(&self) -> Option<&str> {
        (**self).module()
    }
    fn all_fields(&self) -> Vec<FieldDesc> {
        (**self).all_fields()
    }
    fn format_file(&self) -> String {
        (**self).format_file()
    }
    fn attach(&self, file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno> {
        (**self).attach(file)
    }
}

#[cfg(test)]
mod tests {
    use ustrace_ctl::vfs::FileSystem;

    use crate::trace::tracing;

    crate::trace_event! {
        /// Recorded through the probe path of an event whose only check is its filter.
        fn unit_event_file::filtered_probe(a: u64, b: u32) {
            a: u64 = a,
            b: u32 = b,
        }
        print "a=%llu b=%u", a, b;
    }

    /// A filter alone decides on the probe's stack record: what it keeps is written with
    /// its header (written after the filter when the filter reads no common field), and a
    /// filter on a common field sees the header it reads.
    #[test]
    fn the_filter_only_probe_path_keeps_what_passes_with_its_header() {
        let fs = crate::tracefs();
        let inst = "unit_filtered_probe";
        let _ = tracing().remove_instance(inst);
        tracing().create_instance(inst).unwrap();
        let file = |f: &str| format!("instances/{inst}/events/unit_event_file/filtered_probe/{f}");
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        fs.write_file(&file("enable"), "1").unwrap();
        fs.write_file(&file("filter"), "a == 5 || b == 7").unwrap();
        filtered_probe::trace(5, 1);
        filtered_probe::trace(6, 1);
        filtered_probe::trace(6, 7);
        fs.write_file(&file("filter"), &format!("common_pid == {tid} && a == 8"))
            .unwrap();
        filtered_probe::trace(8, 0);
        filtered_probe::trace(9, 0);
        fs.write_file(&file("filter"), &format!("common_pid != {tid}"))
            .unwrap();
        filtered_probe::trace(8, 1);
        fs.write_file(&file("filter"), "0").unwrap();
        filtered_probe::trace(10, 2);
        fs.write_file(&file("enable"), "0").unwrap();
        let trace = fs
            .read_to_string(&format!("instances/{inst}/trace"))
            .unwrap();
        let lines: Vec<&str> = trace
            .lines()
            .filter(|l| l.contains("filtered_probe:"))
            .collect();
        let fields: Vec<&str> = lines
            .iter()
            .map(|l| l.split("filtered_probe: ").nth(1).unwrap())
            .collect();
        assert_eq!(
            fields,
            ["a=5 b=1", "a=6 b=7", "a=8 b=0", "a=10 b=2"],
            "{trace}"
        );
        assert!(
            lines.iter().all(|l| l.contains(&format!("-{tid} "))),
            "{trace}"
        );
        tracing().remove_instance(inst).unwrap();
    }

    crate::trace_event! {
        /// Held in soft mode by a conditional trigger.
        fn unit_event_file::triggered_probe(a: u64) {
            a: u64 = a,
        }
        print "a=%llu", a;
    }

    /// A soft-disabled event whose triggers are all conditional takes the record path
    /// straight from its probe: its triggers see the record, which is not kept, and a pid
    /// filter still stops it first.
    #[test]
    fn conditional_triggers_of_a_soft_disabled_event_see_the_record_unless_pid_filtered() {
        let fs = crate::tracefs();
        let inst = "unit_triggered_probe";
        let _ = tracing().remove_instance(inst);
        tracing().create_instance(inst).unwrap();
        let path = |f: &str| format!("instances/{inst}/{f}");
        let trigger = path("events/unit_event_file/triggered_probe/trigger");
        fs.write_file(&trigger, "traceoff if a == 3").unwrap();
        let on = || fs.read_to_string(&path("tracing_on")).unwrap();
        triggered_probe::trace(2);
        assert_eq!(on(), "1\n");
        triggered_probe::trace(3);
        assert_eq!(on(), "0\n");
        fs.write_file(&path("tracing_on"), "1").unwrap();
        // SAFETY: getpid has no arguments and cannot fail.
        let other = unsafe { libc::getpid() } + 1_000_000;
        fs.write_file(&path("set_event_pid"), &other.to_string())
            .unwrap();
        triggered_probe::trace(3);
        assert_eq!(on(), "1\n");
        fs.write_file(&path("set_event_pid"), "").unwrap();
        fs.write_file(&trigger, "!traceoff if a == 3").unwrap();
        let trace = fs.read_to_string(&path("trace")).unwrap();
        assert!(!trace.contains("triggered_probe:"), "{trace}");
        tracing().remove_instance(inst).unwrap();
    }
}
