//! The FUSE door: a process's tracefs mounted on a directory, over its control socket.
//!
//! The kernel hands FUSE requests (by inode number) to [`fuser`]; this adapter turns them into
//! control-socket calls (by path), so `echo 1 > DIR/events/.../enable` and `cat DIR/trace` act
//! on the remote tracefs exactly as on the kernel's:
//!
//! ```text
//!   sh: echo x > DIR/f ──► kernel FUSE ──► Adapter::open(ino, O_WRONLY|O_TRUNC)
//!                                            │  ino → "f" (inode table)
//!                                            ▼
//!                              Client (one connection per open file) ──► control socket
//!   write error: Invalid argument ◄── errno in the Write reply, passed through unchanged
//! ```
//!
//! Choices that make it behave like tracefs:
//! - every file is opened `direct_io`, so a file whose size reads 0 is still read to its end,
//!   and each write(2) reaches the tracefs as one write;
//! - `O_TRUNC` arrives atomically with the open (`FUSE_ATOMIC_O_TRUNC`), `O_APPEND` as a flag;
//! - stream reads (`trace_pipe`) block on a thread of their own, in slices; between slices the
//!   reader checks whether the reading thread has a signal pending (read from
//!   `/proc/<tid>/status`), and answers `EINTR` so Ctrl-C ends a blocked `cat`. fuser answers
//!   FUSE_INTERRUPT with ENOSYS, after which the kernel waits for our answer; this check is
//!   what lets the answer come;
//! - a read takes the file's flags of the moment (libtracefs sets `O_NONBLOCK` with `fcntl`
//!   after the open and reads `trace_pipe_raw` to `EAGAIN`);
//! - `trace_pipe_raw` can be spliced from (trace-cmd record does): the kernel's FUSE splices
//!   through the page cache, so it shows a size nobody reaches (`SPLICE_SIZE`), and answers
//!   `ioctl(fd, 0)`, the kernel's wake-up, with success;
//! - the mount's source (fsname) is `tracefs`; tools find tracefs by the type, though, which
//!   `ustrace exec` provides (a private namespace where the mount covers the kernel's);
//! - the kernel enforces the modes shown (`default_permissions`): the tracefs's own, owned by
//!   the mounting user, or with [`MountOptions::allow_group`] owned by that group with no
//!   bits for others; `chmod`/`chown` are kept per inode, and the operations tracefs lacks
//!   fail with the kernel's errnos (`EPERM`, `EACCES` for create);
//! - root mounts with mount(2); a user mounts through the setuid `fusermount3`, which hands
//!   back the open /dev/fuse (`_FUSE_COMMFD`), and unmounts through it too, as libfuse does;
//!   when that fails the error names why (usually a /dev/fuse only root may open);
//! - a mount whose server was killed leaves the directory answering `ENOTCONN`;
//!   [`cleanup_stale`] detaches it (`umount2(MNT_DETACH)`), and [`Mount::spawn`] calls it first.

use crate::client::{Client, CtlError};
use crate::vfs::{DirEntry, Errno, FileKind, OpenFlags, Stat};
use fuser::{
    Config, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, MountOption, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyWrite, ReplyXattr, Request,
    SessionACL, WriteFlags,
};
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Attributes are not cached by the kernel: tracefs entries come and go (instances, events).
const TTL: Duration = Duration::ZERO;
/// The size shown for `trace_pipe_raw`. The kernel's FUSE splices from a file through its
/// page cache (even a `direct_io` one), page by page with our read answering each, but never
/// past the file's size: at tracefs's size, 0, a splice always gives nothing, and libtracefs
/// (trace-cmd record) splices. So these files show an end nobody reaches; each open drops
/// the pages of the last (no `FOPEN_KEEP_CACHE`), and readahead is off (`init`), so every
/// page read is one ring-buffer page read, in order.
const SPLICE_SIZE: u64 = i64::MAX as u64;
/// One wait for stream data before the pending-signal check.
const STREAM_POLL: Duration = Duration::from_millis(100);
/// Idle connections kept for reuse.
const POOL_SIZE: usize = 8;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn ferr(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.0)
}

fn cerr(e: &CtlError) -> fuser::Errno {
    ferr(e.errno())
}

/// A directory's entries as the kernel gets them: inode, type, name.
type Listing = Vec<(u64, FileType, String)>;

/// What `chmod`/`chown` set on one inode. The kernel's tracefs accepts both and keeps them
/// on the inode until the file goes away; the control socket has no such request (the
/// traced process's tree has no owners), so the mount keeps them, per inode.
#[derive(Clone, Copy, Default)]
struct Changed {
    perm: Option<u16>,
    uid: Option<u32>,
    gid: Option<u32>,
}

/// Two-way map between inode numbers and tracefs paths. Numbers are never reused, so a stale
/// inode can only ever name the path it was given for.
struct Inodes {
    by_path: HashMap<String, u64>,
    paths: HashMap<u64, String>,
    next: u64,
}

impl Inodes {
    fn new() -> Inodes {
        let mut i = Inodes {
            by_path: HashMap::new(),
            paths: HashMap::new(),
            next: 2,
        };
        i.by_path.insert(String::new(), 1);
        i.paths.insert(1, String::new());
        i
    }
    fn ino(&mut self, path: &str) -> u64 {
        if let Some(ino) = self.by_path.get(path) {
            return *ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_path.insert(path.to_owned(), ino);
        self.paths.insert(ino, path.to_owned());
        ino
    }
    fn path(&self, ino: u64) -> Option<String> {
        self.paths.get(&ino).cloned()
    }
}

fn join(parent: &str, name: &OsStr) -> Result<String, fuser::Errno> {
    let name = name.to_str().ok_or(fuser::Errno::ENOENT)?;
    if name == ".." || name == "." || name.contains('/') {
        return Err(fuser::Errno::EINVAL);
    }
    Ok(if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}/{name}")
    })
}

/// A file opened through the mount: its own connection, and for snapshot files the bytes
/// read so far, so reads at any offset below the end are answered without going back.
struct OpenRemote {
    client: Client,
    handle: u64,
    stream: bool,
    /// A `trace_pipe_raw`, which tools splice from (see `SPLICE_SIZE`).
    raw: bool,
    /// The last page a splice took was mostly empty (see `PARTIAL_PAUSE`).
    partial_last: bool,
    cache: Vec<u8>,
    eof: bool,
    /// The task the connection was last told it acts for (`Client::act_for`).
    acting_for: Option<u32>,
    /// Where and how it was opened, to open it again after a commit (see `flush`).
    path: String,
    flags: OpenFlags,
    /// Written to since it was (re)opened.
    written: bool,
    /// Its remote file was closed by `flush`: the next read or write opens it again.
    committed: bool,
}

impl OpenRemote {
    /// Opens the remote file again after `flush` closed it: appending, since what was
    /// written before is applied already (a second truncation would undo it).
    fn reopen_if_committed(&mut self) -> Result<(), fuser::Errno> {
        if !self.committed {
            return Ok(());
        }
        let flags = OpenFlags {
            truncate: false,
            append: self.flags.write,
            ..self.flags
        };
        let remote = self.client.open(&self.path, flags).map_err(|e| cerr(&e))?;
        self.handle = remote.handle;
        self.committed = false;
        self.acting_for = None;
        Ok(())
    }
}

struct Adapter {
    socket: PathBuf,
    pool: Mutex<Vec<Client>>,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, Arc<Mutex<OpenRemote>>>>,
    /// Directory listings taken at opendir, by directory handle.
    listings: Mutex<HashMap<u64, Listing>>,
    next_fh: AtomicU64,
    uid: u32,
    gid: u32,
    /// The group let in with [`MountOptions::allow_group`].
    group: Option<u32>,
    changed: Mutex<HashMap<u64, Changed>>,
    stopping: Arc<AtomicBool>,
}

/// Whether thread `tid` has a signal pending that it does not block: the kernel is then
/// waiting for us to finish the request so it can deliver it.
fn signal_pending(tid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        // The thread is gone: nobody waits for this answer any more.
        return true;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let pending = field("SigPnd:") | field("ShdPnd:");
    let blocked = field("SigBlk:");
    // SIGKILL (bit 8) is never blockable; a fatal signal is turned into it for the group.
    pending & (!blocked | 1 << (libc::SIGKILL - 1)) != 0
}

impl Adapter {
    fn client(&self) -> Result<Client, fuser::Errno> {
        if let Some(c) = lock(&self.pool).pop() {
            return Ok(c);
        }
        Client::connect_path(&self.socket).map_err(|_| fuser::Errno::from_i32(libc::ENOTCONN))
    }

    fn give_back(&self, client: Client) {
        let mut pool = lock(&self.pool);
        if pool.len() < POOL_SIZE {
            pool.push(client);
        }
    }

    /// Runs one call on a pooled connection; a connection that failed at the transport level
    /// is dropped rather than reused.
    fn with_client<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, CtlError>,
    ) -> Result<T, fuser::Errno> {
        let mut client = self.client()?;
        let result = f(&mut client);
        match &result {
            Err(CtlError::Io(_)) | Err(CtlError::Protocol(_)) => {}
            _ => self.give_back(client),
        }
        result.map_err(|e| cerr(&e))
    }

    fn path(&self, ino: INodeNo) -> Result<String, fuser::Errno> {
        lock(&self.inodes).path(ino.0).ok_or(fuser::Errno::ENOENT)
    }

    fn attr(&self, ino: u64, st: Stat) -> FileAttr {
        let kind = match st.kind {
            FileKind::Dir => FileType::Directory,
            FileKind::File => FileType::RegularFile,
        };
        let (mut perm, mut gid) =
            shown_mode(st.mode, kind == FileType::Directory, self.gid, self.group);
        let mut uid = self.uid;
        if let Some(c) = lock(&self.changed).get(&ino) {
            perm = c.perm.unwrap_or(perm);
            uid = c.uid.unwrap_or(uid);
            gid = c.gid.unwrap_or(gid);
        }
        let now = SystemTime::now();
        let size = if kind == FileType::RegularFile && self.splices(ino) {
            SPLICE_SIZE
        } else {
            0
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid,
            gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Whether `ino` is a `trace_pipe_raw`, which tools splice from (see [`SPLICE_SIZE`]).
    fn splices(&self, ino: u64) -> bool {
        lock(&self.inodes)
            .path(ino)
            .is_some_and(|p| is_raw_pipe(&p))
    }

    fn entry(&self, path: &str) -> Result<FileAttr, fuser::Errno> {
        let st = self.with_client(|c| c.stat(path))?;
        let ino = lock(&self.inodes).ino(path);
        Ok(self.attr(ino, st))
    }

    /// A directory's entries with `.` and `..`, numbered for the inode table.
    fn listing(&self, ino: INodeNo) -> Result<Listing, fuser::Errno> {
        let path = self.path(ino)?;
        let entries = self.with_client(|c| c.readdir(&path))?;
        let mut inodes = lock(&self.inodes);
        let parent_ino = match path.rfind('/') {
            _ if path.is_empty() => 1,
            Some(i) => inodes.ino(&path[..i]),
            None => 1,
        };
        let mut all = vec![
            (ino.0, FileType::Directory, ".".to_owned()),
            (parent_ino, FileType::Directory, "..".to_owned()),
        ];
        for DirEntry { name, kind } in entries {
            let child = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}/{name}")
            };
            let kind = match kind {
                FileKind::Dir => FileType::Directory,
                FileKind::File => FileType::RegularFile,
            };
            all.push((inodes.ino(&child), kind, name));
        }
        Ok(all)
    }

    /// Forgets what chmod/chown set on `path` and everything below it: a removed instance
    /// made again starts with the tracefs's modes, as on the kernel.
    fn forget_changes(&self, path: &str) {
        let inodes = lock(&self.inodes);
        let mut changed = lock(&self.changed);
        let below = format!("{path}/");
        changed.retain(|ino, _| {
            inodes
                .path(*ino)
                .is_none_or(|p| p != path && !p.starts_with(&below))
        });
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<Mutex<OpenRemote>>, fuser::Errno> {
        lock(&self.files)
            .get(&fh.0)
            .cloned()
            .ok_or(fuser::Errno::EBADF)
    }
}

/// The mode and group a path is shown with. Without a group the tracefs's own modes stand
/// (the kernel's: files 0640/0440, owner-only directories), and FUSE lets nobody but the
/// mounting user in. With one, everything belongs to that group: it gets the group bits the
/// tracefs gives (read `trace_pipe`, not write `enable`, as the kernel's tracefs mounted with
/// `gid=`), directories also let it search and list (like `mode=750`), and others get
/// nothing, since with `allow_other` only these modes keep them out.
fn shown_mode(mode: u32, dir: bool, own_gid: u32, group: Option<u32>) -> (u16, u32) {
    let mut perm = mode & 0o7777;
    let Some(group) = group else {
        return (perm as u16, own_gid);
    };
    perm &= !0o007;
    if dir {
        perm |= (perm & 0o500) >> 3;
    }
    (perm as u16, group)
}

fn open_flags(flags: i32) -> OpenFlags {
    let acc = flags & libc::O_ACCMODE;
    OpenFlags {
        read: acc == libc::O_RDONLY || acc == libc::O_RDWR,
        write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
        truncate: flags & libc::O_TRUNC != 0,
        append: flags & libc::O_APPEND != 0,
        nonblock: flags & libc::O_NONBLOCK != 0,
    }
}

/// Whether `path` is a `trace_pipe_raw` (of any CPU, of any instance).
fn is_raw_pipe(path: &str) -> bool {
    path == "trace_pipe_raw" || path.ends_with("/trace_pipe_raw")
}

/// Data bytes in a ring-buffer page (4096 less its 16-byte header).
const PAGE_DATA: usize = 4080;
/// After a splice took a page less than three quarters full, its next page waits this long:
/// the kernel's splice of `trace_pipe_raw` moves only full pages (waking at `buffer_percent`),
/// and without a pause a recorder would take one page per event or two, as fast as it can.
const PARTIAL_PAUSE: Duration = Duration::from_millis(50);

/// The length of the events on a ring-buffer page, from its header's commit word.
fn page_len(page: &[u8]) -> usize {
    page.get(8..16)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()) & 0xf_ffff)
        .unwrap_or(0) as usize
}

/// Answers one stream read, waiting in slices until data, a signal for the reader, or the
/// mount going away.
#[allow(clippy::too_many_arguments)]
fn stream_read(
    file: Arc<Mutex<OpenRemote>>,
    size: u32,
    nonblock: bool,
    splice: bool,
    tid: u32,
    stopping: Arc<AtomicBool>,
    reply: ReplyData,
) {
    let mut f = lock(&file);
    let handle = f.handle;
    if splice && f.partial_last {
        let until = Instant::now() + PARTIAL_PAUSE;
        while Instant::now() < until && !stopping.load(Ordering::SeqCst) {
            if signal_pending(tid) {
                f.partial_last = false;
                return reply.error(fuser::Errno::EINTR);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let wait = if nonblock {
        Duration::ZERO
    } else {
        STREAM_POLL
    };
    loop {
        // The mount is going away: end of file lets a blocked `cat` finish normally (an
        // EINTR would only make it retry, as coreutils does, until the connection dies).
        if stopping.load(Ordering::SeqCst) {
            return reply.data(&[]);
        }
        match f.client.read(handle, size, Some(wait)) {
            Ok(data) => {
                if splice {
                    f.partial_last = page_len(&data) < PAGE_DATA * 3 / 4;
                }
                return reply.data(&data);
            }
            Err(CtlError::Remote { errno, .. }) if errno == Errno::EAGAIN => {
                if nonblock {
                    return reply.error(fuser::Errno::EAGAIN);
                }
                if signal_pending(tid) {
                    return reply.error(fuser::Errno::EINTR);
                }
            }
            Err(e) => return reply.error(cerr(&e)),
        }
    }
}

impl Filesystem for Adapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Without this the kernel truncates with setattr(size=0) and opens without O_TRUNC,
        // and `trace` would never learn it is being cleared.
        if config
            .add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC)
            .is_err()
        {
            return Err(io::Error::other("the kernel's FUSE lacks atomic O_TRUNC"));
        }
        // Under a page: no readahead, so a splice reads only the pages it moves (every
        // read of a stream consumes it).
        let _ = config.set_max_readahead(1);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = self
            .path(parent)
            .and_then(|p| join(&p, name))
            .and_then(|p| self.entry(&p));
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self
            .path(ino)
            .and_then(|p| self.with_client(|c| c.stat(&p)))
        {
            Ok(st) => reply.attr(&TTL, &self.attr(ino.0, st)),
            Err(e) => reply.error(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Truncation arrives with the open (atomic O_TRUNC), and tracefs times do not move:
        // like the kernel's tracefs, accept those and change nothing. chmod and chown are
        // kept (see `Changed`); the kernel has already checked, from the modes, that the
        // caller may make them (default_permissions).
        let stat = self
            .path(ino)
            .and_then(|p| self.with_client(|c| c.stat(&p)));
        if stat.is_ok() && (mode.is_some() || uid.is_some() || gid.is_some()) {
            let mut changed = lock(&self.changed);
            let c = changed.entry(ino.0).or_default();
            if let Some(m) = mode {
                c.perm = Some((m & 0o7777) as u16);
            }
            if uid.is_some() {
                c.uid = uid;
            }
            if gid.is_some() {
                c.gid = gid;
            }
        }
        match stat {
            Ok(st) => reply.attr(&TTL, &self.attr(ino.0, st)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let result = self
            .path(parent)
            .and_then(|p| join(&p, name))
            .and_then(|p| {
                self.with_client(|c| c.mkdir(&p))?;
                self.entry(&p)
            });
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self
            .path(parent)
            .and_then(|p| join(&p, name))
            .and_then(|p| {
                self.with_client(|c| c.rmdir(&p))?;
                Ok(p)
            });
        match result {
            Ok(p) => {
                self.forget_changes(&p);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    // The operations tracefs does not have answer as the kernel's tracefs does (checked on
    // 6.18): EPERM for unlink, rename, link, symlink and mknod; EACCES for create.

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(fuser::Errno::EPERM);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(fuser::Errno::EPERM);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(fuser::Errno::EPERM);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(fuser::Errno::EPERM);
    }

    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(fuser::Errno::EPERM);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        // tracefs has no create: the kernel answers a redirect to a new name with EACCES.
        reply.error(fuser::Errno::EACCES);
    }

    /// tracefs has no extended attributes: an empty list, as the kernel's gives. (Getting,
    /// setting and removing one fall to fuser's ENOSYS, which the kernel's FUSE turns into
    /// EOPNOTSUPP, tracefs's answer too.)
    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        if let Err(e) = self.path(ino) {
            return reply.error(e);
        }
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: fuser::OpenFlags, reply: ReplyOpen) {
        let flags = open_flags(flags.0);
        let opened = (|| {
            let path = self.path(ino)?;
            let mut client = self.client()?;
            let remote = client.open(&path, flags).map_err(|e| cerr(&e))?;
            Ok::<_, fuser::Errno>(OpenRemote {
                client,
                handle: remote.handle,
                stream: remote.stream,
                raw: is_raw_pipe(&path),
                partial_last: false,
                cache: Vec::new(),
                eof: false,
                acting_for: None,
                path,
                flags,
                written: false,
                committed: false,
            })
        })();
        match opened {
            Ok(file) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                let mut fopen = FopenFlags::FOPEN_DIRECT_IO;
                if file.stream {
                    fopen |= FopenFlags::FOPEN_NONSEEKABLE;
                }
                // A stream file's read(2) then arrives at offset 0, while the page reads of
                // a splice arrive at the file position it moves (see `SPLICE_SIZE`): that is
                // how `read` tells the two apart.
                if file.raw {
                    fopen |= FopenFlags::FOPEN_STREAM;
                }
                lock(&self.files).insert(fh, Arc::new(Mutex::new(file)));
                reply.opened(FileHandle(fh), fopen);
            }
            Err(e) => reply.error(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let file = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        // The file's flags now, not at open: libtracefs opens `trace_pipe_raw` blocking and
        // sets O_NONBLOCK with fcntl(F_SETFL) for its final flush, and expects EAGAIN then.
        let nonblock = flags.0 & libc::O_NONBLOCK != 0;
        if lock(&file).stream {
            let (tid, stopping) = (req.pid(), self.stopping.clone());
            // A splice's page read (past its first page; see `open`), blocking.
            let splice = offset > 0 && !nonblock && lock(&file).raw;
            // If the thread cannot start, the closure (and the reply in it) is dropped, and
            // fuser answers a dropped reply with EIO.
            let _ = std::thread::Builder::new()
                .name("ustrace-fuse-pipe".into())
                .spawn(move || stream_read(file, size, nonblock, splice, tid, stopping, reply));
            return;
        }
        let mut f = lock(&file);
        let want = (offset as usize).saturating_add(size as usize);
        if !f.eof && f.cache.len() < want {
            if let Err(e) = f.reopen_if_committed() {
                return reply.error(e);
            }
        }
        while !f.eof && f.cache.len() < want {
            let handle = f.handle;
            let chunk = (want - f.cache.len()).clamp(64 * 1024, crate::proto::MAX_DATA) as u32;
            match f.client.read(handle, chunk, Some(Duration::ZERO)) {
                Ok(data) if data.is_empty() => f.eof = true,
                Ok(data) => f.cache.extend_from_slice(&data),
                Err(e) => return reply.error(cerr(&e)),
            }
        }
        let start = (offset as usize).min(f.cache.len());
        let end = want.min(f.cache.len());
        reply.data(&f.cache[start..end]);
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let file = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let mut f = lock(&file);
        if let Err(e) = f.reopen_if_committed() {
            return reply.error(e);
        }
        // The traced process records the task that wrote (trace_marker), not this mount.
        let writer = req.pid();
        if f.acting_for != Some(writer) {
            // Refused by an older server (ENOSYS) or for a writer gone already (ESRCH): the
            // write is still served, and not asked again for the same writer.
            let _ = f.client.act_for(writer);
            f.acting_for = Some(writer);
        }
        let handle = f.handle;
        f.written = true;
        match f.client.write(handle, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(cerr(&e)),
        }
    }

    /// close(2) of a descriptor. Files that act when closed (`set_ftrace_filter` applies
    /// its words, as the kernel's does at release) are closed here, once something was
    /// written: the kernel sends FUSE's `release` only after close(2) has returned, in the
    /// background, so a command run next (`echo > trace`) could otherwise come first. A
    /// shell's `echo x > FILE` flushes twice (the descriptor it opened, before the write,
    /// then the one it wrote through); only the second has something to apply. Written
    /// again through another descriptor of the same open file, it is opened again.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let Ok(file) = self.file(fh) else {
            return reply.ok();
        };
        let mut f = lock(&file);
        if f.written && !f.committed && !f.stream {
            let handle = f.handle;
            f.written = false;
            f.committed = true;
            let _ = f.client.close(handle);
        }
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let file = lock(&self.files).remove(&fh.0);
        reply.ok();
        if let Some(file) = file {
            if let Ok(f) =
                Arc::try_unwrap(file).map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
            {
                let mut client = f.client;
                if f.committed || client.close(f.handle).is_ok() {
                    self.give_back(client);
                }
            }
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    /// `ioctl(fd, 0)` on `trace_pipe_raw` is the kernel's "wake the blocked readers", which
    /// libtracefs calls when it stops a recorder; it succeeds there, and here, where a
    /// blocked read looks for a pending signal every `STREAM_POLL` anyway. Everything else
    /// is refused as tracefs refuses it (`ENOTTY`; no ring-buffer mmap here).
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        match self.file(fh) {
            Ok(file) if cmd == 0 && lock(&file).raw => reply.ioctl(0, &[]),
            Ok(_) => reply.error(fuser::Errno::from_i32(libc::ENOTTY)),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: fuser::OpenFlags, reply: ReplyOpen) {
        // One listing per opendir: `ls` pages through it in several readdir calls, and every
        // page must come from the same snapshot, as on the kernel's tracefs.
        match self.listing(ino) {
            Ok(all) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                lock(&self.listings).insert(fh, all);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listings = lock(&self.listings);
        let Some(all) = listings.get(&fh.0) else {
            return reply.error(fuser::Errno::EBADF);
        };
        for (i, (child, kind, name)) in all.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*child), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.listings).remove(&fh.0);
        reply.ok();
    }
}

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// The mount's source in /proc/mounts.
    pub fsname: String,
    /// Let the members of this group use the mount too (FUSE `allow_other`, limited by
    /// `default_permissions` to what the modes grant: see `shown_mode`). `None`: only the
    /// mounting user. There is no way to open it to everyone: any reader of `trace_pipe`
    /// consumes what the owner traces.
    pub allow_group: Option<u32>,
    /// Mount with mount(2) even when not root: the caller made its own user and mount
    /// namespaces (`ustrace exec`), where it may, and where the setuid `fusermount3` would
    /// not help (a setuid binary runs as its owner only where that owner is mapped).
    pub own_namespace: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            fsname: "tracefs".into(),
            allow_group: None,
            own_namespace: false,
        }
    }
}

fn cpath(dir: &Path) -> io::Result<CString> {
    CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn detach(dir: &Path) -> io::Result<()> {
    let c = cpath(dir)?;
    // SAFETY: c is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The setuid helper that mounts and unmounts FUSE for users (Debian package fuse3).
const FUSERMOUNT: &str = "fusermount3";

/// Unmounts `dir` lazily: with umount2 as root, else through the setuid helper, which lets a
/// user unmount what they mounted (as libfuse does).
fn unmount_lazily(dir: &Path) -> io::Result<()> {
    match detach(dir) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            let out = std::process::Command::new(FUSERMOUNT)
                .args(["-u", "-q", "-z", "--"])
                .arg(dir)
                .stdin(std::process::Stdio::null())
                .output()?;
            if out.status.success() {
                Ok(())
            } else {
                Err(io::Error::other(format!(
                    "{FUSERMOUNT} -u failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )))
            }
        }
        other => other,
    }
}

/// Why this process cannot mount FUSE itself, if it cannot: opening /dev/fuse is the first
/// step, and where an unprivileged user usually stops (a device only root may open).
fn dev_fuse_refusal() -> Option<String> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => None,
        Err(e) => Some(format!(
            "this user cannot open /dev/fuse ({})",
            Errno(e.raw_os_error().unwrap_or(libc::EIO))
        )),
    }
}

/// Mounts through the setuid `fusermount3`, as libfuse does for users: it opens /dev/fuse,
/// mounts on `dir`, and hands the open device back over a socket (`_FUSE_COMMFD`); the
/// session then runs on that fd. `options` are the mount options, comma-separated.
fn mount_with_helper(dir: &Path, options: &str) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let mut pair = [0i32; 2];
    // SAFETY: pair points at two writable ints, as socketpair requires.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded: both fds are open and owned by nobody else.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
    let their_fd = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new(FUSERMOUNT);
    cmd.arg("-o")
        .arg(options)
        .arg("--")
        .arg(dir)
        .env("_FUSE_COMMFD", their_fd.to_string())
        .env("_FUSE_COMMVERS", "2")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // SAFETY: runs in the child before exec; fcntl is async-signal-safe and the fd is open.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(their_fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot run {FUSERMOUNT} (Debian package fuse3): {e}"),
        )
    })?;
    drop(theirs);
    let received = receive_fd(&ours);
    let out = child.wait_with_output()?;
    match received {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let said = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            Err(io::Error::other(if said.is_empty() {
                format!("{FUSERMOUNT} {}: {e}", out.status)
            } else if said.starts_with(FUSERMOUNT) {
                said
            } else {
                format!("{FUSERMOUNT}: {said}")
            }))
        }
    }
}

/// Receives the one fd `fusermount3` sends (SCM_RIGHTS) on `sock`.
fn receive_fd(sock: &std::os::fd::OwnedFd) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut byte = 0u8;
    let mut iov = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    // Room for one cmsghdr carrying one int, aligned as cmsghdr needs.
    let mut space = [0u64; 8];
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&space);
    let n = loop {
        // SAFETY: msg points at live buffers of the lengths it states.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break n;
        }
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: msg was filled by recvmsg; CMSG_FIRSTHDR/CMSG_DATA stay within msg_control.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if n == 0
            || cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(io::Error::other("it sent no file descriptor"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// The mount options in `fusermount3 -o` form.
fn helper_options(options: &[MountOption], acl: SessionACL) -> String {
    let mut out: Vec<String> = options
        .iter()
        .map(|o| match o {
            MountOption::FSName(name) => format!("fsname={name}"),
            MountOption::Subtype(sub) => format!("subtype={sub}"),
            MountOption::DefaultPermissions => "default_permissions".into(),
            MountOption::NoSuid => "nosuid".into(),
            MountOption::NoDev => "nodev".into(),
            MountOption::NoAtime => "noatime".into(),
            other => format!("{other:?}").to_lowercase(),
        })
        .collect();
    if acl == SessionACL::All {
        out.push("allow_other".into());
    }
    out.join(",")
}

/// `/proc/mounts` and `/proc/self/mountinfo` write space, tab, newline and backslash in paths
/// as octal escapes; this gives the path back.
pub fn unescape_mount_path(field: &str) -> String {
    let mut out = Vec::new();
    let b = field.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `/proc/self/mounts` lists a FUSE mount with source `fsname` at `dir`.
fn listed_as_ours(dir: &Path, fsname: &str) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    mounts.lines().any(|line| {
        let mut fields = line.split(' ');
        let (Some(source), Some(target), Some(fstype)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return false;
        };
        source == fsname
            && fstype.starts_with("fuse")
            && Path::new(&unescape_mount_path(target)) == dir
    })
}

/// Detaches a dead ustrace mount at `dir` (one whose FUSE server was killed, so every access
/// fails with `ENOTCONN`). Returns whether there was one. A dead mount of anything else is
/// left alone, with an error saying so.
pub fn cleanup_stale(dir: &Path) -> io::Result<bool> {
    match std::fs::metadata(dir) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            // The dead mount point itself cannot be resolved; its parent can.
            let absolute = match (dir.parent(), dir.file_name()) {
                (Some(parent), Some(name)) => {
                    let parent = if parent.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        parent
                    };
                    parent.canonicalize()?.join(name)
                }
                _ => dir.to_owned(),
            };
            if !listed_as_ours(&absolute, &MountOptions::default().fsname) {
                return Err(io::Error::other(format!(
                    "{} is a dead mount that ustrace did not make; `umount -l` it first",
                    dir.display()
                )));
            }
            unmount_lazily(&absolute).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot detach the stale mount at {}: {e}", dir.display()),
                )
            })?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// A live mount. Dropping it unmounts (lazily, so a busy mount still goes away).
pub struct Mount {
    dir: PathBuf,
    session: Option<fuser::BackgroundSession>,
    stopping: Arc<AtomicBool>,
    /// An idle connection whose hang-up says the traced process is gone.
    watch: Client,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount").field("dir", &self.dir).finish()
    }
}

impl Mount {
    /// Mounts the tracefs served at `socket` on `dir`, detaching a stale mount there first.
    pub fn spawn(socket: &Path, dir: &Path, options: &MountOptions) -> io::Result<Mount> {
        if !Path::new("/dev/fuse").exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "/dev/fuse is missing (modprobe fuse?)",
            ));
        }
        cleanup_stale(dir)?;
        let dir = dir
            .canonicalize()
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        let mut watch = Client::connect_path(socket).map_err(io::Error::other)?;
        watch.hello().map_err(io::Error::other)?;
        let stopping = Arc::new(AtomicBool::new(false));
        let adapter = || Adapter {
            socket: socket.to_owned(),
            pool: Mutex::new(Vec::new()),
            inodes: Mutex::new(Inodes::new()),
            files: Mutex::new(HashMap::new()),
            listings: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            // SAFETY: getuid/getgid have no preconditions and cannot fail.
            uid: unsafe { libc::getuid() },
            // SAFETY: as above.
            gid: unsafe { libc::getgid() },
            group: options.allow_group,
            changed: Mutex::new(HashMap::new()),
            stopping: stopping.clone(),
        };
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName(options.fsname.clone()),
            MountOption::Subtype("ustrace".into()),
            MountOption::DefaultPermissions,
            MountOption::NoSuid,
            MountOption::NoDev,
            MountOption::NoAtime,
        ];
        // The kernel checks every access against the modes (DefaultPermissions above), so
        // letting other users in gives them only what the group bits grant.
        if options.allow_group.is_some() {
            config.acl = SessionACL::All;
        }
        config.n_threads = Some(2);
        let failed = |e: io::Error| {
            io::Error::new(e.kind(), format!("cannot mount on {}: {e}", dir.display()))
        };
        // SAFETY: geteuid has no preconditions and cannot fail.
        let session = if options.own_namespace || unsafe { libc::geteuid() } == 0 {
            fuser::spawn_mount(adapter(), &dir, &config).map_err(failed)?
        } else {
            // mount(2) needs root, so a user mounts through the setuid helper, as libfuse
            // does; when that fails too, the first cause is usually /dev/fuse itself.
            let fd = mount_with_helper(&dir, &helper_options(&config.mount_options, config.acl))
                .map_err(|helper| {
                    failed(io::Error::other(match dev_fuse_refusal() {
                        Some(device) => format!("{device}; {helper}"),
                        None => helper.to_string(),
                    }))
                })?;
            let acl = config.acl;
            match fuser::Session::from_fd(adapter(), fd, acl, config)
                .and_then(fuser::Session::spawn)
            {
                Ok(session) => session,
                Err(e) => {
                    let _ = unmount_lazily(&dir);
                    return Err(failed(e));
                }
            }
        };
        Ok(Mount {
            dir,
            session: Some(session),
            stopping,
            watch,
        })
    }

    /// Where it is mounted.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the traced process closed its end (it exited or was killed).
    pub fn server_gone(&self) -> bool {
        let stream = self.watch.raw_stream();
        let mut fd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(stream),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, timeout 0: a non-blocking check.
        let n = unsafe { libc::poll(&mut fd, 1, 0) };
        n > 0 && fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Whether the mount ended from outside (`umount DIR`).
    pub fn session_ended(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmounts and waits (briefly) for the FUSE session to finish.
    pub fn unmount(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        let Some(session) = self.session.take() else {
            return;
        };
        if !session.guard.is_finished() {
            let _ = unmount_lazily(&self.dir);
        }
        let guard = session.guard;
        // Files still open (a blocked `cat trace_pipe`) keep the session up until their
        // readers see EINTR; do not wait on them forever.
        let deadline = Instant::now() + Duration::from_secs(2);
        while !guard.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if guard.is_finished() {
            let _ = guard.join();
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_numbers_are_stable_and_never_reused() {
        let mut i = Inodes::new();
        assert_eq!(i.ino(""), 1);
        let a = i.ino("events");
        let b = i.ino("events/sched");
        assert_ne!(a, b);
        assert_eq!(i.ino("events"), a);
        assert_eq!(i.path(b).as_deref(), Some("events/sched"));
        assert_eq!(i.path(999), None);
    }

    #[test]
    fn names_join_and_dots_are_refused() {
        assert_eq!(join("", OsStr::new("trace")).unwrap(), "trace");
        assert_eq!(join("events", OsStr::new("sched")).unwrap(), "events/sched");
        assert!(join("events", OsStr::new("..")).is_err());
        assert!(join("events", OsStr::new("a/b")).is_err());
    }

    #[test]
    fn open_flags_translate() {
        let f = open_flags(libc::O_WRONLY | libc::O_TRUNC | libc::O_CREAT);
        assert_eq!(
            f,
            OpenFlags {
                write: true,
                truncate: true,
                ..OpenFlags::default()
            }
        );
        let f = open_flags(libc::O_WRONLY | libc::O_APPEND);
        assert_eq!(f, OpenFlags::APPEND);
        let f = open_flags(libc::O_RDONLY | libc::O_NONBLOCK);
        assert_eq!(
            f,
            OpenFlags {
                nonblock: true,
                ..OpenFlags::READ
            }
        );
        assert!(open_flags(libc::O_RDWR).read && open_flags(libc::O_RDWR).write);
    }

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape_mount_path("/x\\011y\\134z"), "/x\ty\\z");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path("/end\\04"), "/end\\04");
        assert!(!listed_as_ours(
            Path::new("/definitely/not/mounted"),
            "tracefs"
        ));
    }

    #[test]
    fn a_named_group_gets_group_bits_and_others_nothing() {
        assert_eq!(shown_mode(0o640, false, 7, None), (0o640, 7));
        assert_eq!(shown_mode(0o700, true, 7, None), (0o700, 7));
        assert_eq!(shown_mode(0o640, false, 7, Some(50)), (0o640, 50));
        assert_eq!(shown_mode(0o644, false, 7, Some(50)), (0o640, 50));
        assert_eq!(shown_mode(0o220, false, 7, Some(50)), (0o220, 50));
        assert_eq!(shown_mode(0o700, true, 7, Some(50)), (0o750, 50));
        assert_eq!(shown_mode(0o755, true, 7, Some(50)), (0o750, 50));
    }

    #[test]
    fn own_thread_has_no_pending_signal() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        assert!(!signal_pending(tid));
        assert!(
            signal_pending(u32::MAX - 3),
            "a vanished thread counts as interrupted"
        );
    }
}
