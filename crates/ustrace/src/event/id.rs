//! Event ids, apart from the registry that hands them out, so that the record path's
//! lowest floors (the ring-buffer side and the per-event stages) can stamp the ids of the
//! entries they write themselves without knowing the registry or event files.

/// An event's id: its `common_type` in every record and its `id` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u16);

/// The id of `ftrace:print`, as the kernel numbers it.
pub const MARKER_ID: EventId = EventId(5);
/// The id of `ftrace:kernel_stack` (what the `stacktrace` trigger records), as the kernel's.
pub const STACK_ID: EventId = EventId(4);
/// The id of `ftrace:user_stack` (what the `userstacktrace` option records), as the kernel's.
pub const USER_STACK_ID: EventId = EventId(13);
