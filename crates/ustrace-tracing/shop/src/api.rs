//! The request handlers.

use std::time::Duration;

use tracing::{info, instrument, warn};

/// Serves one request; returns its status.
#[instrument(level = "info")]
pub async fn handle(method: &str, path: &str, user: u64) -> u16 {
    // A point where the task may be taken over by another worker.
    tokio::task::yield_now().await;
    let status = route(method, path).await;
    info!(name: "served", status, path, user, "request done");
    status
}

async fn route(method: &str, path: &str) -> u16 {
    if method != "GET" {
        return 405;
    }
    if let Some(item) = path.strip_prefix("/api/item/") {
        return match item.parse() {
            Ok(item) => lookup(item).await,
            Err(_) => 400,
        };
    }
    if path.starts_with("/static/") {
        return 200;
    }
    404
}

/// The item's record from the "backend": a short wait; every 50th item's backend is down.
#[instrument(level = "info")]
async fn lookup(item: u64) -> u16 {
    tokio::time::sleep(Duration::from_micros(20 + item % 100)).await;
    if item % 50 == 49 {
        warn!(item, "backend unavailable");
        return 503;
    }
    if item.is_multiple_of(10) {
        404
    } else {
        200
    }
}
