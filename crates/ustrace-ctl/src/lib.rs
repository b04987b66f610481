//! The boundary between a tracefs and the doors it is reached through.
//!
//! [`vfs`] is the file-system interface every door calls: the in-process API, the control
//! socket and the FUSE mount all speak to one [`vfs::FileSystem`], so behaviour cannot drift
//! between them.

pub mod vfs;
