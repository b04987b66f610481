//! Connections: the server side and a client that generates load.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tracing::instrument;

/// Accepts connections until accepting fails, one task each.
pub async fn serve(listener: TcpListener) -> io::Result<()> {
    let mut conn = 0u64;
    loop {
        let (stream, peer) = listener.accept().await?;
        conn += 1;
        tokio::spawn(connection(stream, conn, peer));
    }
}

/// `METHOD PATH user=N`; `None` for anything else.
fn parse(line: &str) -> Option<(&str, &str, u64)> {
    let mut words = line.split_whitespace();
    let method = words.next()?;
    let path = words.next()?;
    let user = words.next()?.strip_prefix("user=")?.parse().ok()?;
    Some((method, path, user))
}

#[instrument(level = "info", skip(stream), fields(peer = %peer))]
async fn connection(stream: TcpStream, conn: u64, peer: SocketAddr) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let status = match parse(&line) {
            Some((method, path, user)) => crate::api::handle(method, path, user).await,
            None => 400,
        };
        if write
            .write_all(format!("{status}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The `i`-th request of the generated load: mostly item lookups, some static files, a
/// few unknown paths and a few POSTs.
pub fn request(i: u64) -> String {
    let user = i % 7;
    match i % 20 {
        0 => format!("POST /api/item/{} user={user}", i % 1000),
        1..=3 => format!("GET /static/app.js user={user}"),
        4 => format!("GET /admin user={user}"),
        _ => format!("GET /api/item/{} user={user}", (i * 7) % 1000),
    }
}

/// Sends `per_conn` generated requests (numbered from `first`) on each of `conns`
/// concurrent connections; returns the statuses, in request order per connection.
pub async fn load(
    addr: SocketAddr,
    conns: u64,
    per_conn: u64,
    first: u64,
) -> io::Result<Vec<Vec<u16>>> {
    let mut tasks = Vec::new();
    for c in 0..conns {
        tasks.push(tokio::spawn(async move {
            let stream = TcpStream::connect(addr).await?;
            let (read, mut write) = stream.into_split();
            let mut answers = BufReader::new(read).lines();
            let mut statuses = Vec::new();
            for r in 0..per_conn {
                let line = request(first + c * per_conn + r);
                write.write_all(format!("{line}\n").as_bytes()).await?;
                let answer = answers
                    .next_line()
                    .await?
                    .ok_or_else(|| io::Error::other("the server hung up"))?;
                statuses.push(answer.parse().map_err(io::Error::other)?);
            }
            Ok::<_, io::Error>(statuses)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.push(task.await.map_err(io::Error::other)??);
    }
    Ok(all)
}
