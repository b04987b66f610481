//! The demo of issue 17: a tokio service instrumented only with `tracing` (the `shop`
//! crate: `#[instrument]` handlers, an `info!` per request), with the ustrace layer
//! installed and its tracefs served, so a shell enables, filters and triggers its
//! callsites while it runs:
//!
//! ```sh
//! cargo run --release -p ustrace-tracing --example tokio_service -- 60 &
//! ustrace write -p PID events/shop_api/served/filter 'status >= 500'
//! ustrace write -p PID events/shop_api/served/trigger 'stacktrace if status == 503'
//! ustrace write -p PID events/shop_api/served/enable 1
//! ustrace cat -p PID trace
//! ```
//!
//! README.md ("A tokio service, traced from the shell") shows a whole session. The
//! argument is how many seconds to run (default: until killed); the service answers its
//! own generated load on 127.0.0.1: four connections, a request every few milliseconds.

use std::time::{Duration, Instant};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secs: Option<u64> = match std::env::args().nth(1) {
        Some(arg) => Some(arg.parse().map_err(|_| format!("not seconds: {arg:?}"))?),
        None => None,
    };
    // The one line a service adds (beside its fmt or OpenTelemetry layers, if any).
    tracing_subscriber::registry()
        .with(ustrace_tracing::layer())
        .init();
    let socket = ustrace::serve()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        eprintln!(
            "tokio_service: pid {} serves {addr}, tracefs at {}",
            std::process::id(),
            socket.display()
        );
        tokio::spawn(shop::server::serve(listener));
        let start = Instant::now();
        let (mut first, mut errors) = (0u64, 0usize);
        while secs.is_none_or(|s| start.elapsed() < Duration::from_secs(s)) {
            let statuses = shop::server::load(addr, 4, 10, first).await?;
            errors += statuses.iter().flatten().filter(|s| **s >= 500).count();
            first += 40;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!("tokio_service: {first} requests, {errors} answered 5xx");
        Ok(())
    })
}
