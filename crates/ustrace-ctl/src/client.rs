//! The client side of the control socket: one connection, one request at a time.
//!
//! The CLI verbs and the FUSE adapter both sit on this. Every call sends one request frame and
//! waits for its one reply; a remote failure comes back as [`CtlError::Remote`] carrying the
//! errno the tracefs returned, so a door can hand it on unchanged (a bad filter written
//! through the mount shows up in the shell as `Invalid argument`).

use crate::discover;
use crate::proto::{self, FrameError, Reply, Request};
use crate::vfs::{DirEntry, Errno, OpenFlags, Stat};
use std::fmt;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a non-streaming request may take before the client gives up on the server.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a control-socket call failed.
#[derive(Debug)]
pub enum CtlError {
    /// The connection failed (includes finding or reaching the socket).
    Io(io::Error),
    /// The tracefs refused the operation.
    Remote { errno: Errno, message: String },
    /// The server answered something this client cannot make sense of.
    Protocol(String),
}

impl CtlError {
    /// The errno a door should report for this failure.
    pub fn errno(&self) -> Errno {
        match self {
            CtlError::Io(e) => Errno(e.raw_os_error().unwrap_or(match e.kind() {
                io::ErrorKind::TimedOut => libc::ETIMEDOUT,
                _ => libc::EIO,
            })),
            CtlError::Remote { errno, .. } => *errno,
            CtlError::Protocol(_) => Errno(libc::EPROTO),
        }
    }
}

impl fmt::Display for CtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CtlError::Io(e) => write!(f, "{e}"),
            CtlError::Remote { errno, message } if message.is_empty() => write!(f, "{errno}"),
            CtlError::Remote { errno, message } => write!(f, "{errno} ({message})"),
            CtlError::Protocol(m) => write!(f, "protocol error: {m}"),
        }
    }
}

impl std::error::Error for CtlError {}

impl From<io::Error> for CtlError {
    fn from(e: io::Error) -> Self {
        CtlError::Io(e)
    }
}

/// What the server says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    pub version: u8,
    pub pid: u32,
    pub comm: String,
}

/// An open file on the server, valid on the connection that opened it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteFile {
    pub handle: u64,
    /// A stream file (`trace_pipe`): reads consume and block.
    pub stream: bool,
}

/// One connection to a process's control socket.
pub struct Client {
    stream: UnixStream,
    socket: PathBuf,
    timeout: Option<Duration>,
}

fn unexpected(reply: Reply) -> CtlError {
    CtlError::Protocol(format!("unexpected reply {reply:?}"))
}

impl Client {
    /// Connects to the process with this pid.
    pub fn connect(pid: u32) -> Result<Client, CtlError> {
        let path = discover::find_socket(pid)?;
        Client::connect_path(&path)
    }

    /// Connects to the socket at `path`.
    pub fn connect_path(path: &Path) -> Result<Client, CtlError> {
        let stream = UnixStream::connect(path).map_err(|e| {
            let what = if e.raw_os_error() == Some(libc::EACCES) {
                " (only the process's own user and root may connect)"
            } else {
                ""
            };
            CtlError::Io(io::Error::new(
                e.kind(),
                format!("cannot connect to {}: {e}{what}", path.display()),
            ))
        })?;
        Ok(Client {
            stream,
            socket: path.to_owned(),
            timeout: Some(DEFAULT_TIMEOUT),
        })
    }

    /// A client over an already-connected stream (a socket pair, an inherited fd).
    pub fn from_stream(stream: UnixStream) -> Client {
        Client {
            stream,
            socket: PathBuf::new(),
            timeout: Some(DEFAULT_TIMEOUT),
        }
    }

    /// The socket this client is connected to.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// How long a non-streaming call may wait for its reply (`None`: forever).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }

    fn call_with(&mut self, req: &Request, wait: Option<Duration>) -> Result<Reply, CtlError> {
        self.stream.set_read_timeout(wait)?;
        if let Err(sent) = self.stream.write_all(&req.encode()) {
            // A server that refuses a connection (uid, connection limit) writes its error
            // reply and closes at once, so sending may fail with EPIPE while the reply is
            // waiting to be read: prefer the reply, which says why.
            let _ = self
                .stream
                .set_read_timeout(Some(Duration::from_millis(200)));
            return match proto::read_frame(&mut self.stream) {
                Ok(body) => match Reply::decode(&body) {
                    Ok(Reply::Error { errno, message }) => Err(CtlError::Remote {
                        errno: Errno(errno),
                        message,
                    }),
                    _ => Err(CtlError::Io(sent)),
                },
                Err(_) => Err(CtlError::Io(sent)),
            };
        }
        let body = proto::read_frame(&mut self.stream).map_err(|e| match e {
            FrameError::Io(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                // The reply timed out: say so, rather than "Resource temporarily unavailable".
                CtlError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no reply from the traced process within {:?} (is it stopped, or out \
                         of file descriptors?)",
                        wait.unwrap_or_default()
                    ),
                ))
            }
            FrameError::Io(e) => CtlError::Io(e),
            FrameError::Closed => CtlError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the traced process closed the connection",
            )),
            other => CtlError::Protocol(other.to_string()),
        })?;
        match Reply::decode(&body).map_err(|e| CtlError::Protocol(e.to_string()))? {
            Reply::Error { errno, message } => Err(CtlError::Remote {
                errno: Errno(errno),
                message,
            }),
            reply => Ok(reply),
        }
    }

    fn call(&mut self, req: &Request) -> Result<Reply, CtlError> {
        self.call_with(req, self.timeout)
    }

    pub fn hello(&mut self) -> Result<ServerInfo, CtlError> {
        match self.call(&Request::Hello)? {
            Reply::Hello { version, pid, comm } => Ok(ServerInfo { version, pid, comm }),
            r => Err(unexpected(r)),
        }
    }

    pub fn stat(&mut self, path: &str) -> Result<Stat, CtlError> {
        match self.call(&Request::Stat { path: path.into() })? {
            Reply::Stat(st) => Ok(st),
            r => Err(unexpected(r)),
        }
    }

    pub fn readdir(&mut self, path: &str) -> Result<Vec<DirEntry>, CtlError> {
        match self.call(&Request::ReadDir { path: path.into() })? {
            Reply::Entries(e) => Ok(e),
            r => Err(unexpected(r)),
        }
    }

    pub fn open(&mut self, path: &str, flags: OpenFlags) -> Result<RemoteFile, CtlError> {
        match self.call(&Request::Open {
            path: path.into(),
            flags,
        })? {
            Reply::Opened { handle, stream } => Ok(RemoteFile { handle, stream }),
            r => Err(unexpected(r)),
        }
    }

    /// Reads up to `max` bytes; empty is end of file. On a stream, waits up to `wait` for
    /// data (`None`: until data arrives), then fails with `EAGAIN`.
    pub fn read(
        &mut self,
        handle: u64,
        max: u32,
        wait: Option<Duration>,
    ) -> Result<Vec<u8>, CtlError> {
        let wait_ms = match wait {
            None => proto::WAIT_FOREVER,
            Some(w) => u32::try_from(w.as_millis()).unwrap_or(proto::WAIT_FOREVER - 1),
        };
        let reply_within = match (wait, self.timeout) {
            (None, _) | (_, None) => None,
            (Some(w), Some(t)) => Some(w + t),
        };
        match self.call_with(
            &Request::Read {
                handle,
                max,
                wait_ms,
            },
            reply_within,
        )? {
            Reply::Data(d) => Ok(d),
            r => Err(unexpected(r)),
        }
    }

    pub fn write(&mut self, handle: u64, data: &[u8]) -> Result<usize, CtlError> {
        match self.call(&Request::Write {
            handle,
            data: data.to_vec(),
        })? {
            Reply::Written(n) => Ok(n as usize),
            r => Err(unexpected(r)),
        }
    }

    pub fn close(&mut self, handle: u64) -> Result<(), CtlError> {
        match self.call(&Request::Close { handle })? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    /// Reads a (non-stream) file from start to end.
    pub fn read_file(&mut self, path: &str) -> Result<Vec<u8>, CtlError> {
        let file = self.open(path, OpenFlags::READ)?;
        if file.stream {
            let _ = self.close(file.handle);
            return Err(CtlError::Remote {
                errno: Errno::EINVAL,
                message: format!("{path} is a stream; read it with a loop of reads"),
            });
        }
        let mut out = Vec::new();
        let result = loop {
            match self.read(file.handle, proto::MAX_DATA as u32, Some(Duration::ZERO)) {
                Ok(chunk) if chunk.is_empty() => break Ok(()),
                Ok(chunk) => out.extend_from_slice(&chunk),
                Err(e) => break Err(e),
            }
        };
        let closed = self.close(file.handle);
        result?;
        closed?;
        Ok(out)
    }

    /// Writes `data` as one write(2), after opening with `O_TRUNC` (or `O_APPEND`).
    pub fn write_file(&mut self, path: &str, data: &[u8], append: bool) -> Result<usize, CtlError> {
        let req = Request::WriteFile {
            path: path.into(),
            data: data.to_vec(),
            append,
        };
        match self.call(&req)? {
            Reply::Written(n) => Ok(n as usize),
            r => Err(unexpected(r)),
        }
    }

    pub fn mkdir(&mut self, path: &str) -> Result<(), CtlError> {
        match self.call(&Request::Mkdir { path: path.into() })? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    pub fn rmdir(&mut self, path: &str) -> Result<(), CtlError> {
        match self.call(&Request::Rmdir { path: path.into() })? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    /// Makes the following requests act for task `pid` (0: for this process again), so a
    /// `trace_marker` write records that task as its writer. A server older than the request
    /// answers `ENOSYS`: it records this process.
    pub fn act_for(&mut self, pid: u32) -> Result<(), CtlError> {
        match self.call(&Request::ActFor { pid })? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    pub(crate) fn raw_stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Sends raw bytes, for tests of how a server copes with malformed input.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads one raw reply after [`Client::send_raw`].
    pub fn recv_reply(&mut self) -> Result<Reply, CtlError> {
        self.stream.set_read_timeout(self.timeout)?;
        let body = proto::read_frame(&mut self.stream).map_err(|e| match e {
            FrameError::Io(e) => CtlError::Io(e),
            other => CtlError::Protocol(other.to_string()),
        })?;
        Reply::decode(&body).map_err(|e| CtlError::Protocol(e.to_string()))
    }
}

/// One process that answered on its control socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// The process id.
    pub pid: u32,
    /// The process's command name, as it reported it.
    pub comm: String,
    /// The socket it answered on.
    pub socket: PathBuf,
    /// The protocol version it speaks.
    pub version: u8,
}

/// Lists the processes serving a tracefs in `dirs`: asks each live socket who it is, and
/// removes the sockets that nobody listens on any more (the pid now belongs to another
/// process).
pub fn list_in(dirs: &[PathBuf]) -> Vec<Served> {
    let mut out = Vec::new();
    for (pid, path) in discover::live_sockets_in(dirs) {
        match Client::connect_path(&path) {
            Ok(mut client) => {
                client.set_timeout(Some(Duration::from_secs(2)));
                if let Ok(info) = client.hello() {
                    out.push(Served {
                        pid,
                        comm: info.comm,
                        socket: path,
                        version: info.version,
                    });
                }
            }
            Err(e) if e.errno().0 == libc::ECONNREFUSED => {
                let _ = std::fs::remove_file(&path);
            }
            Err(_) => {}
        }
    }
    out.sort_by_key(|s| s.pid);
    out
}

/// Lists every process serving a tracefs that this user can see (`ustrace ps`).
pub fn list() -> Vec<Served> {
    list_in(&discover::scan_dirs())
}
