//! The boundary between a tracefs and the doors it is reached through.
//!
//! [`vfs`] is the file-system interface every door calls: the in-process API, the control
//! socket and the FUSE mount all speak to one [`vfs::FileSystem`], so behaviour cannot drift
//! between them.
//!
//! ```text
//!   traced process                         shell
//!   ┌──────────────────────────┐           ┌──────────────────────────────┐
//!   │ tracefs (FileSystem)     │           │ ustrace cat/write/ls/pipe    │
//!   │   ▲                      │  Unix     │   client::Client             │
//!   │   │ server (own threads) │◄─socket──►│ ustrace mount: fuse::Mount   │
//!   └───┴──────────────────────┘  proto    │   (kernel FUSE ◄── echo, cat) │
//!                                           └──────────────────────────────┘
//! ```
//!
//! - [`proto`]: the framed, versioned wire format;
//! - [`server`]: serving a tracefs on `<dir>/<pid>.sock` (`serve`, `serve_from_env`);
//! - [`client`]: one connection to a served tracefs;
//! - [`discover`]: where sockets live, and which processes serve one (`ustrace ps`);
//! - [`fuse`]: mounting a served tracefs on a directory;
//! - [`memfs`]: an in-memory tracefs-shaped tree for tests and trials.

pub mod client;
pub mod discover;
pub mod fuse;
pub mod memfs;
pub mod proto;
pub mod server;
pub mod vfs;
