//! The consuming readers: `trace_pipe` (text) and `trace_pipe_raw` (whole pages).
//!
//! Reading consumes: each event is given to one reader once. A read with nothing to give
//! blocks until an event arrives (the ring buffer's wait, which costs writers nothing while
//! no one waits), or fails with `EAGAIN` when opened non-blocking or when the caller's
//! timeout passes — the control socket uses timeouts to notice a client that went away.
//! An open reader keeps its instance from being removed (`EBUSY`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ustrace_ctl::vfs::{Errno, OpenFile};

use crate::output::{format_event_at, Cursor};
use crate::trace::Instance;

/// What a pipe reads: every CPU's events merged in time order, or one CPU's.
pub struct TracePipe {
    instance: Arc<Instance>,
    cpu: Option<usize>,
    raw: bool,
    nonblock: bool,
    pending: Vec<u8>,
    /// Where this reader is, for the latency format's entry index.
    cursor: Cursor,
}

impl TracePipe {
    /// A consuming reader of `instance`'s buffer: one CPU or all merged, text or raw pages
    /// (`trace_pipe_raw`), blocking or not.
    pub fn new(instance: Arc<Instance>, cpu: Option<usize>, raw: bool, nonblock: bool) -> Self {
        instance.users.fetch_add(1, Ordering::SeqCst);
        TracePipe {
            cursor: Cursor::for_pipe(&instance),
            instance,
            cpu,
            raw,
            nonblock,
            pending: Vec::new(),
        }
    }

    /// Moves whatever is available now into `pending`; true if anything was.
    fn fill(&mut self, limit: usize) -> bool {
        let buffer = self.instance.buffer();
        if self.raw {
            let cpu = self.cpu.unwrap_or(0);
            if let Some(page) = buffer.read_page(cpu) {
                self.pending.extend_from_slice(&page);
                return true;
            }
            return false;
        }
        let mut text = Vec::new();
        while text.len() < limit {
            let next = match self.cpu {
                Some(cpu) => buffer.consume(cpu),
                None => buffer.consume_any(),
            };
            let Some(event) = next else { break };
            // A consuming reader cannot look at the next entry without taking it, so the
            // latency format's gap to it shows as none.
            format_event_at(&self.instance, &mut self.cursor, &event, None, &mut text);
        }
        self.pending.extend_from_slice(&text);
        !text.is_empty()
    }
}

impl OpenFile for TracePipe {
    fn read(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> Result<usize, Errno> {
        let deadline = timeout.map(|t| Instant::now() + t);
        while self.pending.is_empty() {
            if self.fill(buf.len()) {
                break;
            }
            if self.nonblock {
                return Err(Errno::EAGAIN);
            }
            let wait = match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Errno::EAGAIN);
                    }
                    Some((deadline - now).min(Duration::from_millis(100)))
                }
                None => Some(Duration::from_millis(100)),
            };
            self.instance.buffer().wait(self.cpu, wait);
        }
        let n = self.pending.len().min(buf.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        Ok(n)
    }

    fn write(&mut self, _data: &[u8]) -> Result<usize, Errno> {
        Err(Errno::EINVAL)
    }

    fn is_stream(&self) -> bool {
        true
    }
}

impl Drop for TracePipe {
    fn drop(&mut self) {
        self.instance.users.fetch_sub(1, Ordering::SeqCst);
    }
}
