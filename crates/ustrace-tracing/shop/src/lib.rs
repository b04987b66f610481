//! A small tokio service instrumented only with `tracing`, as services are: the demo of
//! `ustrace-tracing` (`examples/tokio_service.rs` runs it) and, in that crate's tests, the
//! callsites of a crate other than the test's own.
//!
//! The protocol is one request a line, `METHOD PATH user=N`, answered by a line with the
//! status. Each connection is a task; each request goes through `#[instrument]`ed async
//! handlers that await (a yield, a timer), so under a multi-thread runtime a request's
//! spans are entered on whichever worker polls the task at the time.
//!
//! Callsites, by target (ustrace system):
//! - `shop::server` (`shop_server`): span `connection` (`conn`, `peer`).
//! - `shop::api` (`shop_api`): spans `handle` (`method`, `path`, `user`) and `lookup`
//!   (`item`), the event `served` (`status`, `path`, `user`) and a warning `backend
//!   unavailable` (`item`) before each 503.

pub mod api;
pub mod server;
