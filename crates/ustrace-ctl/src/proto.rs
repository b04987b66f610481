//! The control-socket wire protocol: framed, versioned requests and replies.
//!
//! Every message travels as one frame: a little-endian `u32` body length, then the body. The
//! body starts with the protocol version and a one-byte code saying which request or reply it
//! is; the fields follow in a fixed order. Strings are a `u16` length plus UTF-8 bytes, byte
//! blobs a `u32` length plus bytes. Every length is checked against a hard limit before
//! anything is allocated, so a hostile peer can neither make the server allocate gigabytes nor
//! read past the end of a frame.
//!
//! ```text
//!  +-----------+---------+------+---------------------------+
//!  | len: u32  | version | code | fields ...                |
//!  |  (LE)     |   u8    |  u8  | (len - 2 bytes)           |
//!  +-----------+---------+------+---------------------------+
//!   e.g. Stat("events"):
//!   0a 00 00 00 | 01 | 02 | 06 00 'e' 'v' 'e' 'n' 't' 's'
//! ```
//!
//! A client sends one request frame and reads exactly one reply frame; requests on one
//! connection are answered in order. Streaming reads (`trace_pipe`) are plain `Read` requests
//! on a stream handle with a wait time: the server blocks up to that long for data, so a
//! client streams by issuing reads in a loop. `docs/ctl-protocol.md` is the full reference.

use crate::vfs::{DirEntry, Errno, FileKind, OpenFlags, Stat};
use std::fmt;

/// The protocol version this build speaks; a frame carrying another is refused.
pub const VERSION: u8 = 1;
/// The most bytes a `Read` reply or a `Write` request carries.
pub const MAX_DATA: usize = 1 << 20;
/// The longest path, in bytes.
pub const MAX_PATH: usize = 4096;
/// The longest error message, in bytes.
pub const MAX_MESSAGE: usize = 4096;
/// The most entries one directory listing carries.
pub const MAX_ENTRIES: usize = 65536;
/// The largest frame body either side accepts. A directory listing is bounded separately by
/// this (each entry costs at least 3 bytes), not by `MAX_ENTRIES` alone.
pub const MAX_FRAME: usize = MAX_DATA + MAX_PATH + 64;

/// Wait forever in a `Read` on a stream.
pub const WAIT_FOREVER: u32 = u32::MAX;

/// What a client asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Who are you: returns [`Reply::Hello`].
    Hello,
    Stat {
        path: String,
    },
    ReadDir {
        path: String,
    },
    /// Opens a file; returns [`Reply::Opened`] with a handle private to this connection.
    Open {
        path: String,
        flags: OpenFlags,
    },
    /// Reads up to `max` bytes. On a stream handle the server waits up to `wait_ms` for data
    /// (`0`: do not wait, [`WAIT_FOREVER`]: until data or the client hangs up).
    Read {
        handle: u64,
        max: u32,
        wait_ms: u32,
    },
    Write {
        handle: u64,
        data: Vec<u8>,
    },
    Close {
        handle: u64,
    },
    /// Open with `O_TRUNC` (or `O_APPEND`), write `data` as one write(2), close.
    WriteFile {
        path: String,
        data: Vec<u8>,
        append: bool,
    },
    Mkdir {
        path: String,
    },
    Rmdir {
        path: String,
    },
    /// The requests that follow on this connection act for task `pid` (0: for the peer
    /// itself, the default): what they record as their writer (`trace_marker`) is that task,
    /// as the kernel records the task that wrote. A FUSE mount names the task of each write.
    ActFor {
        pid: u32,
    },
}

/// What the server answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Hello {
        version: u8,
        pid: u32,
        comm: String,
    },
    Ok,
    Stat(Stat),
    Entries(Vec<DirEntry>),
    Opened {
        handle: u64,
        stream: bool,
    },
    /// Read bytes; empty is end of file.
    Data(Vec<u8>),
    Written(u32),
    /// The operation failed with `errno`; `message` says more for a human.
    Error {
        errno: i32,
        message: String,
    },
}

/// Why a frame body could not be decoded. Each maps to the errno the server answers with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The body ended before field `field` was complete.
    Truncated { field: &'static str },
    /// Bytes were left over after the last field.
    TrailingBytes { extra: usize },
    /// The frame speaks another protocol version.
    Version { got: u8 },
    /// An unknown request or reply code.
    UnknownCode { code: u8 },
    /// A length field exceeds its limit.
    TooLong {
        field: &'static str,
        len: usize,
        limit: usize,
    },
    /// A string is not UTF-8 or contains NUL.
    BadString { field: &'static str },
    /// A field holds a value that has no meaning (a flag bit, a kind).
    BadValue { field: &'static str, value: u64 },
}

impl DecodeError {
    /// The errno a server replies with when a request fails to decode.
    pub fn errno(&self) -> Errno {
        match self {
            DecodeError::Version { .. } => Errno(libc::EPROTONOSUPPORT),
            DecodeError::UnknownCode { .. } => Errno::ENOSYS,
            DecodeError::TooLong { .. } => Errno::E2BIG,
            _ => Errno::EINVAL,
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { field } => write!(f, "frame truncated in field {field}"),
            DecodeError::TrailingBytes { extra } => {
                write!(f, "{extra} unexpected bytes after the last field")
            }
            DecodeError::Version { got } => {
                write!(
                    f,
                    "protocol version {got} is not supported (this side speaks {VERSION})"
                )
            }
            DecodeError::UnknownCode { code } => write!(f, "unknown message code {code:#04x}"),
            DecodeError::TooLong { field, len, limit } => {
                write!(f, "field {field} is {len} bytes, over the limit of {limit}")
            }
            DecodeError::BadString { field } => {
                write!(f, "field {field} is not UTF-8 text without NUL bytes")
            }
            DecodeError::BadValue { field, value } => {
                write!(f, "field {field} holds the meaningless value {value:#x}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

mod code {
    pub const HELLO: u8 = 0x01;
    pub const STAT: u8 = 0x02;
    pub const READDIR: u8 = 0x03;
    pub const OPEN: u8 = 0x04;
    pub const READ: u8 = 0x05;
    pub const WRITE: u8 = 0x06;
    pub const CLOSE: u8 = 0x07;
    pub const WRITE_FILE: u8 = 0x08;
    pub const MKDIR: u8 = 0x09;
    pub const RMDIR: u8 = 0x0a;
    pub const ACT_FOR: u8 = 0x0b;

    pub const R_HELLO: u8 = 0x81;
    pub const R_OK: u8 = 0x82;
    pub const R_STAT: u8 = 0x83;
    pub const R_ENTRIES: u8 = 0x84;
    pub const R_OPENED: u8 = 0x85;
    pub const R_DATA: u8 = 0x86;
    pub const R_WRITTEN: u8 = 0x87;
    pub const R_ERROR: u8 = 0xff;
}

const FLAG_READ: u8 = 1;
const FLAG_WRITE: u8 = 2;
const FLAG_TRUNCATE: u8 = 4;
const FLAG_APPEND: u8 = 8;
const FLAG_NONBLOCK: u8 = 16;
const FLAGS_KNOWN: u8 = 31;

fn flags_to_byte(f: OpenFlags) -> u8 {
    let mut b = 0;
    for (on, bit) in [
        (f.read, FLAG_READ),
        (f.write, FLAG_WRITE),
        (f.truncate, FLAG_TRUNCATE),
        (f.append, FLAG_APPEND),
        (f.nonblock, FLAG_NONBLOCK),
    ] {
        if on {
            b |= bit;
        }
    }
    b
}

fn flags_from_byte(b: u8) -> Result<OpenFlags, DecodeError> {
    if b & !FLAGS_KNOWN != 0 {
        return Err(DecodeError::BadValue {
            field: "flags",
            value: u64::from(b),
        });
    }
    Ok(OpenFlags {
        read: b & FLAG_READ != 0,
        write: b & FLAG_WRITE != 0,
        truncate: b & FLAG_TRUNCATE != 0,
        append: b & FLAG_APPEND != 0,
        nonblock: b & FLAG_NONBLOCK != 0,
    })
}

/// Builds one frame; the length word is filled in by [`Writer::finish`].
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn new(code: u8) -> Writer {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&[0, 0, 0, 0, VERSION, code]);
        Writer { buf }
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Strings longer than the `u16` length can say are cut at a character boundary; the
    /// limits the decoder enforces are lower still, so an encoder never silently sends one.
    fn str(&mut self, s: &str) -> &mut Self {
        let mut end = s.len().min(u16::MAX as usize);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.buf.extend_from_slice(&(end as u16).to_le_bytes());
        self.buf.extend_from_slice(&s.as_bytes()[..end]);
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(&b[..len as usize]);
        self
    }
    fn finish(&mut self) -> Vec<u8> {
        let body = (self.buf.len() - 4) as u32;
        self.buf[..4].copy_from_slice(&body.to_le_bytes());
        std::mem::take(&mut self.buf)
    }
}

/// Reads fields off one frame body, never past its end.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError::Truncated { field });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }
    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, field)?[0])
    }
    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, field)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        Ok(self.u32(field)? as i32)
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn str(&mut self, field: &'static str, limit: usize) -> Result<String, DecodeError> {
        let len = self.u16(field)? as usize;
        if len > limit {
            return Err(DecodeError::TooLong { field, len, limit });
        }
        let raw = self.take(len, field)?;
        let s = std::str::from_utf8(raw).map_err(|_| DecodeError::BadString { field })?;
        if s.contains('\0') {
            return Err(DecodeError::BadString { field });
        }
        Ok(s.to_owned())
    }
    fn bytes(&mut self, field: &'static str, limit: usize) -> Result<Vec<u8>, DecodeError> {
        let len = self.u32(field)? as usize;
        if len > limit {
            return Err(DecodeError::TooLong { field, len, limit });
        }
        Ok(self.take(len, field)?.to_vec())
    }
    fn kind(&mut self) -> Result<FileKind, DecodeError> {
        match self.u8("kind")? {
            0 => Ok(FileKind::Dir),
            1 => Ok(FileKind::File),
            v => Err(DecodeError::BadValue {
                field: "kind",
                value: u64::from(v),
            }),
        }
    }
    fn bool(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::BadValue {
                field,
                value: u64::from(v),
            }),
        }
    }
    fn end(&self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                extra: self.rest.len(),
            })
        }
    }
}

fn kind_byte(k: FileKind) -> u8 {
    match k {
        FileKind::Dir => 0,
        FileKind::File => 1,
    }
}

/// Reads the version and code that open every body.
fn header(body: &[u8]) -> Result<(u8, Reader<'_>), DecodeError> {
    let mut r = Reader { rest: body };
    let version = r.u8("version")?;
    if version != VERSION {
        return Err(DecodeError::Version { got: version });
    }
    let code = r.u8("code")?;
    Ok((code, r))
}

impl Request {
    /// The whole frame, length word included.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Request::Hello => Writer::new(code::HELLO).finish(),
            Request::Stat { path } => Writer::new(code::STAT).str(path).finish(),
            Request::ReadDir { path } => Writer::new(code::READDIR).str(path).finish(),
            Request::Open { path, flags } => Writer::new(code::OPEN)
                .str(path)
                .u8(flags_to_byte(*flags))
                .finish(),
            Request::Read {
                handle,
                max,
                wait_ms,
            } => Writer::new(code::READ)
                .u64(*handle)
                .u32(*max)
                .u32(*wait_ms)
                .finish(),
            Request::Write { handle, data } => {
                Writer::new(code::WRITE).u64(*handle).bytes(data).finish()
            }
            Request::Close { handle } => Writer::new(code::CLOSE).u64(*handle).finish(),
            Request::WriteFile { path, data, append } => Writer::new(code::WRITE_FILE)
                .str(path)
                .u8(u8::from(*append))
                .bytes(data)
                .finish(),
            Request::Mkdir { path } => Writer::new(code::MKDIR).str(path).finish(),
            Request::Rmdir { path } => Writer::new(code::RMDIR).str(path).finish(),
            Request::ActFor { pid } => Writer::new(code::ACT_FOR).u32(*pid).finish(),
        }
    }

    /// Decodes a frame body (the bytes after the length word).
    pub fn decode(body: &[u8]) -> Result<Request, DecodeError> {
        let (code, mut r) = header(body)?;
        let req = match code {
            code::HELLO => Request::Hello,
            code::STAT => Request::Stat {
                path: r.str("path", MAX_PATH)?,
            },
            code::READDIR => Request::ReadDir {
                path: r.str("path", MAX_PATH)?,
            },
            code::OPEN => Request::Open {
                path: r.str("path", MAX_PATH)?,
                flags: flags_from_byte(r.u8("flags")?)?,
            },
            code::READ => Request::Read {
                handle: r.u64("handle")?,
                max: r.u32("max")?,
                wait_ms: r.u32("wait_ms")?,
            },
            code::WRITE => Request::Write {
                handle: r.u64("handle")?,
                data: r.bytes("data", MAX_DATA)?,
            },
            code::CLOSE => Request::Close {
                handle: r.u64("handle")?,
            },
            code::WRITE_FILE => Request::WriteFile {
                path: r.str("path", MAX_PATH)?,
                append: r.bool("append")?,
                data: r.bytes("data", MAX_DATA)?,
            },
            code::MKDIR => Request::Mkdir {
                path: r.str("path", MAX_PATH)?,
            },
            code::RMDIR => Request::Rmdir {
                path: r.str("path", MAX_PATH)?,
            },
            code::ACT_FOR => Request::ActFor { pid: r.u32("pid")? },
            other => return Err(DecodeError::UnknownCode { code: other }),
        };
        r.end()?;
        Ok(req)
    }
}

impl Reply {
    /// An error reply carrying `errno` and a message for a human.
    pub fn error(errno: Errno, message: impl Into<String>) -> Reply {
        Reply::Error {
            errno: errno.0,
            message: message.into(),
        }
    }

    /// The whole frame, length word included.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Reply::Hello { version, pid, comm } => Writer::new(code::R_HELLO)
                .u8(*version)
                .u32(*pid)
                .str(comm)
                .finish(),
            Reply::Ok => Writer::new(code::R_OK).finish(),
            Reply::Stat(st) => Writer::new(code::R_STAT)
                .u8(kind_byte(st.kind))
                .u32(st.mode)
                .finish(),
            Reply::Entries(entries) => {
                let mut w = Writer::new(code::R_ENTRIES);
                w.u32(entries.len() as u32);
                for e in entries {
                    w.u8(kind_byte(e.kind)).str(&e.name);
                }
                w.finish()
            }
            Reply::Opened { handle, stream } => Writer::new(code::R_OPENED)
                .u64(*handle)
                .u8(u8::from(*stream))
                .finish(),
            Reply::Data(data) => Writer::new(code::R_DATA).bytes(data).finish(),
            Reply::Written(n) => Writer::new(code::R_WRITTEN).u32(*n).finish(),
            Reply::Error { errno, message } => {
                let mut end = message.len().min(MAX_MESSAGE);
                while !message.is_char_boundary(end) {
                    end -= 1;
                }
                Writer::new(code::R_ERROR)
                    .i32(*errno)
                    .str(&message[..end])
                    .finish()
            }
        }
    }

    /// Decodes a frame body (the bytes after the length word).
    pub fn decode(body: &[u8]) -> Result<Reply, DecodeError> {
        let (code, mut r) = header(body)?;
        let reply = match code {
            code::R_HELLO => Reply::Hello {
                version: r.u8("version")?,
                pid: r.u32("pid")?,
                comm: r.str("comm", MAX_PATH)?,
            },
            code::R_OK => Reply::Ok,
            code::R_STAT => Reply::Stat(Stat {
                kind: r.kind()?,
                mode: r.u32("mode")?,
            }),
            code::R_ENTRIES => {
                let count = r.u32("count")? as usize;
                if count > MAX_ENTRIES {
                    return Err(DecodeError::TooLong {
                        field: "entries",
                        len: count,
                        limit: MAX_ENTRIES,
                    });
                }
                // Each entry takes at least 3 bytes, so a lying count cannot make us reserve
                // more than the frame could hold.
                let mut entries = Vec::with_capacity(count.min(r.rest.len() / 3));
                for _ in 0..count {
                    let kind = r.kind()?;
                    let name = r.str("name", MAX_PATH)?;
                    entries.push(DirEntry { name, kind });
                }
                Reply::Entries(entries)
            }
            code::R_OPENED => Reply::Opened {
                handle: r.u64("handle")?,
                stream: r.bool("stream")?,
            },
            code::R_DATA => Reply::Data(r.bytes("data", MAX_DATA)?),
            code::R_WRITTEN => Reply::Written(r.u32("written")?),
            code::R_ERROR => Reply::Error {
                errno: r.i32("errno")?,
                message: r.str("message", MAX_MESSAGE)?,
            },
            other => return Err(DecodeError::UnknownCode { code: other }),
        };
        r.end()?;
        Ok(reply)
    }
}

/// Why a frame could not be read off a stream.
#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection cleanly between frames.
    Closed,
    /// The length word announces a body over [`MAX_FRAME`]; the stream cannot be trusted past
    /// this point.
    TooLarge {
        len: usize,
    },
    Io(std::io::Error),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Closed => f.write_str("connection closed"),
            FrameError::TooLarge { len } => {
                write!(f, "frame of {len} bytes exceeds the limit of {MAX_FRAME}")
            }
            FrameError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Reads one frame body. An end of stream in the middle of a frame is an
/// `UnexpectedEof` I/O error, not `Closed`.
pub fn read_frame(r: &mut impl std::io::Read) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => {
                return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge { len });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(FrameError::Io)?;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_flags() -> impl Strategy<Value = OpenFlags> {
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(read, write, truncate, append, nonblock)| OpenFlags {
                read,
                write,
                truncate,
                append,
                nonblock,
            })
    }

    fn arb_path() -> impl Strategy<Value = String> {
        "[a-z_/.]{0,40}"
    }

    fn arb_kind() -> impl Strategy<Value = FileKind> {
        prop_oneof![Just(FileKind::Dir), Just(FileKind::File)]
    }

    fn arb_request() -> impl Strategy<Value = Request> {
        prop_oneof![
            Just(Request::Hello),
            arb_path().prop_map(|path| Request::Stat { path }),
            arb_path().prop_map(|path| Request::ReadDir { path }),
            (arb_path(), arb_flags()).prop_map(|(path, flags)| Request::Open { path, flags }),
            (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(handle, max, wait_ms)| {
                Request::Read {
                    handle,
                    max,
                    wait_ms,
                }
            }),
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..300))
                .prop_map(|(handle, data)| Request::Write { handle, data }),
            any::<u64>().prop_map(|handle| Request::Close { handle }),
            (
                arb_path(),
                proptest::collection::vec(any::<u8>(), 0..300),
                any::<bool>()
            )
                .prop_map(|(path, data, append)| Request::WriteFile {
                    path,
                    data,
                    append
                }),
            arb_path().prop_map(|path| Request::Mkdir { path }),
            arb_path().prop_map(|path| Request::Rmdir { path }),
            any::<u32>().prop_map(|pid| Request::ActFor { pid }),
        ]
    }

    fn arb_reply() -> impl Strategy<Value = Reply> {
        prop_oneof![
            (any::<u8>(), any::<u32>(), "[a-z0-9 ]{0,16}")
                .prop_map(|(version, pid, comm)| Reply::Hello { version, pid, comm }),
            Just(Reply::Ok),
            (arb_kind(), 0u32..0o7777).prop_map(|(kind, mode)| Reply::Stat(Stat { kind, mode })),
            proptest::collection::vec(
                (arb_kind(), "[a-z_:]{1,20}").prop_map(|(kind, name)| DirEntry { name, kind }),
                0..40
            )
            .prop_map(Reply::Entries),
            (any::<u64>(), any::<bool>())
                .prop_map(|(handle, stream)| Reply::Opened { handle, stream }),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(Reply::Data),
            any::<u32>().prop_map(Reply::Written),
            (any::<i32>(), "\\PC{0,30}")
                .prop_map(|(errno, message)| Reply::Error { errno, message }),
        ]
    }

    proptest! {
        #[test]
        fn requests_round_trip(req in arb_request()) {
            let frame = req.encode();
            let body = read_frame(&mut &frame[..]).unwrap();
            prop_assert_eq!(Request::decode(&body).unwrap(), req);
        }

        #[test]
        fn replies_round_trip(reply in arb_reply()) {
            let frame = reply.encode();
            let body = read_frame(&mut &frame[..]).unwrap();
            prop_assert_eq!(Reply::decode(&body).unwrap(), reply);
        }

        #[test]
        fn every_strict_prefix_of_a_request_is_refused(req in arb_request()) {
            let frame = req.encode();
            let body = &frame[4..];
            for cut in 0..body.len() {
                prop_assert!(Request::decode(&body[..cut]).is_err(), "cut {} accepted", cut);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Request::decode(&body);
            let _ = Reply::decode(&body);
        }
    }

    #[test]
    fn worked_example_matches_the_module_doc() {
        let frame = Request::Stat {
            path: "events".into(),
        }
        .encode();
        assert_eq!(frame, b"\x0a\x00\x00\x00\x01\x02\x06\x00events");
    }

    #[test]
    fn errors_name_their_cause_and_errno() {
        assert_eq!(
            Request::decode(&[2, 1]).unwrap_err(),
            DecodeError::Version { got: 2 }
        );
        assert_eq!(
            Request::decode(&[2, 1]).unwrap_err().errno(),
            Errno(libc::EPROTONOSUPPORT)
        );
        let unknown = Request::decode(&[VERSION, 0x77]).unwrap_err();
        assert_eq!(unknown, DecodeError::UnknownCode { code: 0x77 });
        assert_eq!(unknown.errno(), Errno::ENOSYS);
        // A Write announcing 4 GiB of data inside a 20-byte body.
        let mut body = vec![VERSION, code::WRITE];
        body.extend_from_slice(&7u64.to_le_bytes());
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        let huge = Request::decode(&body).unwrap_err();
        assert_eq!(huge.errno(), Errno::E2BIG);
        assert!(huge.to_string().contains("4294967295"), "{huge}");
        // Extra bytes after a complete Hello.
        assert_eq!(
            Request::decode(&[VERSION, code::HELLO, 0]).unwrap_err(),
            DecodeError::TrailingBytes { extra: 1 }
        );
        // NUL inside a path.
        let mut body = vec![VERSION, code::STAT, 3, 0];
        body.extend_from_slice(b"a\0b");
        assert_eq!(
            Request::decode(&body).unwrap_err(),
            DecodeError::BadString { field: "path" }
        );
        // Unknown open flag bits.
        let mut body = vec![VERSION, code::OPEN, 1, 0, b'x', 0x80];
        assert!(matches!(
            Request::decode(&body),
            Err(DecodeError::BadValue { .. })
        ));
        body[5] = FLAG_READ;
        assert!(Request::decode(&body).is_ok());
    }

    #[test]
    fn frame_reader_refuses_huge_lengths_before_allocating() {
        let frame = (u32::MAX).to_le_bytes();
        match read_frame(&mut &frame[..]) {
            Err(FrameError::TooLarge { len }) => assert_eq!(len, u32::MAX as usize),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        match read_frame(&mut &[5u8, 0, 0, 0, 1][..]) {
            Err(FrameError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof),
            other => panic!("expected eof, got {other:?}"),
        }
        assert!(matches!(read_frame(&mut &[][..]), Err(FrameError::Closed)));
        assert!(matches!(
            read_frame(&mut &[1u8, 0][..]),
            Err(FrameError::Io(_))
        ));
    }

    #[test]
    fn entry_count_lies_do_not_allocate_or_panic() {
        let mut body = vec![VERSION, code::R_ENTRIES];
        body.extend_from_slice(&(MAX_ENTRIES as u32).to_le_bytes());
        assert!(matches!(
            Reply::decode(&body),
            Err(DecodeError::Truncated { .. })
        ));
        let mut body = vec![VERSION, code::R_ENTRIES];
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Reply::decode(&body),
            Err(DecodeError::TooLong { .. })
        ));
    }
}
