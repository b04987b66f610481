//! An instance's buffers as its event files see them: the live ring buffer, the snapshot
//! buffer, whether recording is on (with `pause-on-trace`), the pid lists and the CPU mask.
//!
//! This is the floor of the record path. Event files write into it, and the per-event
//! stages ([`stage`](crate::stage)) flip `tracing_on` or take a snapshot through it, without
//! knowing the instance that owns it; the instance and the files above it (`tracing_on`,
//! `snapshot`, `set_event_pid`, `tracing_cpumask`) change it from the control side.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use ustrace_ctl::vfs::Errno;
use ustrace_ringbuf::RingBuffer;

use crate::cpumask::CpuMask;
use crate::rcu::{read_lock, RcuCell};
use crate::thread;

/// What an instance's event files need on the hot path.
pub(crate) struct Shared {
    pub(crate) buffer: RingBuffer,
    pub(crate) record_cmd: AtomicBool,
    pub(crate) snapshot: Mutex<Option<RingBuffer>>,
    pub(crate) pids: RcuCell<PidLists>,
    /// When the buffer was last cleared, in its clock (the kernel's `time_start`): latency
    /// timestamps count from it.
    pub(crate) time_start: AtomicU64,
    /// Readers of `trace` holding recording paused (`pause-on-trace`), and what
    /// `tracing_on` says meanwhile; the mutex orders pauses and resumes.
    paused: AtomicUsize,
    tracing_on_while_paused: AtomicBool,
    pause_lock: Mutex<()>,
    pub(crate) cpumask: CpuMask,
}

impl Shared {
    /// Writes a `kernel_stack` entry (`<stack trace>`) holding `frames`, raw addresses that
    /// the output symbolizes when the trace is read; the `stacktrace` option and trigger both
    /// record through this.
    pub(crate) fn write_kernel_stack(&self, pid: i32, frames: &[usize]) {
        let len = 16 + 8 * frames.len();
        let Some(mut slot) = self.buffer.reserve(len) else {
            return;
        };
        let record: &mut [u8] = &mut slot;
        crate::event::field::write_common_header(record, crate::event::id::STACK_ID.0, pid);
        record[8..12].copy_from_slice(&(frames.len() as i32).to_ne_bytes());
        record[12..16].fill(0);
        for (i, addr) in frames.iter().enumerate() {
            record[16 + 8 * i..24 + 8 * i].copy_from_slice(&(*addr as u64).to_ne_bytes());
        }
        slot.commit();
    }

    /// The state of a new instance around its live `buffer`: recording, no snapshot, no
    /// pid lists, every CPU in the mask.
    pub(crate) fn new(buffer: RingBuffer, nr_cpus: usize) -> Shared {
        Shared {
            buffer,
            record_cmd: AtomicBool::new(true),
            snapshot: Mutex::new(None),
            pids: RcuCell::empty(),
            time_start: AtomicU64::new(0),
            paused: AtomicUsize::new(0),
            tracing_on_while_paused: AtomicBool::new(true),
            pause_lock: Mutex::new(()),
            cpumask: CpuMask::full(nr_cpus),
        }
    }

    /// What `tracing_on` says: whether the buffer records, or while a `pause-on-trace`
    /// reader holds it paused, whether it will record when the pause ends.
    pub(crate) fn tracing_on(&self) -> bool {
        if self.paused.load(Ordering::SeqCst) > 0 {
            return self.tracing_on_while_paused.load(Ordering::SeqCst);
        }
        self.buffer.is_recording()
    }

    /// Writes `tracing_on` (the file, `traceon`/`traceoff` triggers). During a pause it
    /// decides what the buffer does when the pause ends, as the kernel keeps `tracing_on`
    /// apart from its stop count. Atomics only: triggers call it from the record path.
    pub(crate) fn set_tracing_on(&self, on: bool) {
        self.tracing_on_while_paused.store(on, Ordering::SeqCst);
        if self.paused.load(Ordering::SeqCst) == 0 {
            self.buffer.set_recording(on);
        }
    }

    /// Stops recording while a `trace` reader is open (`pause-on-trace`).
    pub(crate) fn pause(&self) {
        let _order = self.pause_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.paused.load(Ordering::SeqCst) == 0 {
            self.tracing_on_while_paused
                .store(self.buffer.is_recording(), Ordering::SeqCst);
        }
        self.paused.fetch_add(1, Ordering::SeqCst);
        self.buffer.set_recording(false);
    }

    /// Ends one reader's pause; the last one gives recording back as `tracing_on` says.
    pub(crate) fn resume(&self) {
        let _order = self.pause_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.paused.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.buffer
                .set_recording(self.tracing_on_while_paused.load(Ordering::SeqCst));
        }
    }

    /// Whether the calling thread's events are kept out by `set_event_pid`/`_notrace_pid`.
    pub(crate) fn ignores_current_thread(&self) -> bool {
        let guard = read_lock();
        match self.pids.get(&guard) {
            Some(lists) => lists.ignores(thread::current_tid(&self.record_cmd)),
            None => false,
        }
    }

    /// Allocates the snapshot buffer if there is none, shaped like the live one.
    pub(crate) fn allocate_snapshot(&self) -> Result<(), Errno> {
        let mut guard = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            // Shaped like the live buffer CPU by CPU, and made of the regions an earlier snapshot
            // left the live buffer (see `RingBuffer::new_like`), so that taking and freeing
            // snapshots over and over holds no more memory or files than one snapshot does.
            *guard = Some(
                self.buffer
                    .new_like("snapshot")
                    .map_err(|_| Errno::ENOMEM)?,
            );
        }
        Ok(())
    }

    /// Takes a snapshot: the snapshot buffer gets what the live one holds, the live one goes on
    /// empty. What `echo 1 > snapshot` and the `snapshot` trigger do.
    pub(crate) fn take_snapshot(&self) -> Result<(), Errno> {
        self.allocate_snapshot()?;
        let guard = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        let snapshot = guard.as_ref().expect("allocated above");
        snapshot.reset();
        self.buffer.swap(snapshot).map_err(|_| Errno::EBUSY)
    }
}

/// The thread ids `set_event_pid` and `set_event_notrace_pid` hold.
#[derive(Clone, Default, Debug)]
pub struct PidLists {
    /// `set_event_pid`: when not empty, only these threads are traced (sorted).
    pub trace: Vec<i32>,
    /// `set_event_notrace_pid`: these threads are never traced (sorted).
    pub notrace: Vec<i32>,
}

impl PidLists {
    /// Whether an event of thread `tid` is kept out of the trace.
    #[inline]
    pub fn ignores(&self, tid: i32) -> bool {
        (!self.trace.is_empty() && self.trace.binary_search(&tid).is_err())
            || self.notrace.binary_search(&tid).is_ok()
    }

    /// Whether neither list has a thread, so no event is kept out by thread.
    pub fn is_empty(&self) -> bool {
        self.trace.is_empty() && self.notrace.is_empty()
    }
}

/// A nanosecond timestamp as the kernel prints it: `SECS.USECS`, seconds right-aligned
/// in five columns (in `trace` lines and `error_log` stamps).
pub struct Seconds(pub u64);

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>5}.{:06}",
            self.0 / 1_000_000_000,
            (self.0 % 1_000_000_000) / 1000
        )
    }
}
