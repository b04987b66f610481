//! The per-event stages of the record path: what runs on one record of one event file
//! between the probe and the ring buffer.
//!
//! A stage sees a record, its event's layout, the slots of one event file (its published
//! programs) and the instance's buffers ([`buffers`](crate::buffers)), and knows nothing of
//! instances, event files or tracefs: the commands that set stages up (the `filter` and
//! `trigger` files, subsystem filters, `enable_event` targets) live above, in
//! [`crate::filter`] and [`crate::trigger`], and hand the stages what they need already
//! resolved. The hist stage ([`hist`]) aggregates records into histograms; the trigger
//! stage runs it on the built record.

pub mod filter;
pub mod hist;
pub mod trigger;
