//! An in-memory [`FileSystem`] shaped like a small tracefs.
//!
//! The doors (control socket, FUSE mount, CLI) must behave the same whatever tracefs sits
//! behind them. This tree lets their tests — and anyone trying a door without a traced
//! workload — exercise every behaviour the doors pass through: snapshot reads, `O_TRUNC`
//! acting at open, appends, writes refused with `EINVAL`, a blocking stream file, and
//! `mkdir`/`rmdir` in an `instances`-like directory.

use crate::vfs::{DirEntry, Errno, FileKind, FileSystem, OpenFile, OpenFlags, Stat};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Decides whether one write(2) chunk is accepted.
pub type WriteCheck = fn(&[u8]) -> bool;

/// The queue behind a stream file: writers push, readers consume and block.
#[derive(Default)]
struct StreamQueue {
    bytes: Mutex<VecDeque<u8>>,
    ready: Condvar,
}

enum Node {
    Dir {
        mode: u32,
        makes_children: bool,
    },
    File {
        mode: u32,
        content: Vec<u8>,
        check: Option<WriteCheck>,
    },
    Stream {
        mode: u32,
        queue: Arc<StreamQueue>,
    },
}

/// The in-memory tree. Cheap to share: wrap it in an `Arc`.
pub struct MemFs {
    nodes: Arc<Mutex<BTreeMap<String, Node>>>,
}

impl Default for MemFs {
    fn default() -> Self {
        Self::new()
    }
}

/// `"/a//b/"` -> `"a/b"`; `..` is refused rather than resolved.
fn clean(path: &str) -> Result<String, Errno> {
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(Errno::EINVAL),
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

fn parent_of(path: &str) -> &str {
    path.rfind('/').map_or("", |i| &path[..i])
}

fn accepts_zero_or_one(data: &[u8]) -> bool {
    matches!(std::str::from_utf8(data).map(str::trim), Ok("0" | "1"))
}

/// Accepts `0` (clear) or `FIELD OP NUMBER` where FIELD is one of the sample event's fields.
fn accepts_sample_filter(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        ["0"] => true,
        [field, op, value] => {
            matches!(*field, "prev_pid" | "next_pid")
                && matches!(*op, "==" | "!=" | "<" | ">" | "<=" | ">=")
                && value.parse::<i64>().is_ok()
        }
        _ => false,
    }
}

impl MemFs {
    /// An empty tree: just the root directory.
    pub fn new() -> MemFs {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            String::new(),
            Node::Dir {
                mode: 0o755,
                makes_children: false,
            },
        );
        MemFs {
            nodes: Arc::new(Mutex::new(nodes)),
        }
    }

    /// A small tracefs: `trace`, `tracing_on`, `trace_pipe` (a stream), one event with
    /// `enable`/`filter`/`format`, and `instances/` where `mkdir` works.
    pub fn sample() -> MemFs {
        let fs = MemFs::new();
        fs.add_file("trace", 0o644, b"# tracer: nop\n", None);
        fs.add_file("tracing_on", 0o644, b"1\n", Some(accepts_zero_or_one));
        fs.add_stream("trace_pipe", 0o444);
        fs.add_dir("events", 0o755, false);
        fs.add_dir("events/sched", 0o755, false);
        fs.add_dir("events/sched/sched_switch", 0o755, false);
        fs.add_file(
            "events/sched/sched_switch/enable",
            0o644,
            b"0\n",
            Some(accepts_zero_or_one),
        );
        fs.add_file(
            "events/sched/sched_switch/filter",
            0o644,
            b"none\n",
            Some(accepts_sample_filter),
        );
        fs.add_file(
            "events/sched/sched_switch/format",
            0o444,
            b"name: sched_switch\nID: 1\nformat:\n\tfield:int prev_pid;\n\tfield:int next_pid;\n",
            None,
        );
        fs.add_dir("instances", 0o755, true);
        fs
    }

    /// Adds a directory; with `makes_children`, `mkdir` and `rmdir` work inside it.
    pub fn add_dir(&self, path: &str, mode: u32, makes_children: bool) {
        let path = clean(path).expect("memfs paths have no ..");
        self.lock().insert(
            path,
            Node::Dir {
                mode,
                makes_children,
            },
        );
    }

    /// Adds a file holding `content`; each write chunk must pass `check` (else `EINVAL`).
    pub fn add_file(&self, path: &str, mode: u32, content: &[u8], check: Option<WriteCheck>) {
        let path = clean(path).expect("memfs paths have no ..");
        self.lock().insert(
            path,
            Node::File {
                mode,
                content: content.to_vec(),
                check,
            },
        );
    }

    /// Adds a stream file: reads consume what [`MemFs::push`] (or a write) queued, and block.
    pub fn add_stream(&self, path: &str, mode: u32) {
        let path = clean(path).expect("memfs paths have no ..");
        self.lock().insert(
            path,
            Node::Stream {
                mode,
                queue: Arc::default(),
            },
        );
    }

    /// Queues bytes on a stream file, waking its readers.
    pub fn push(&self, path: &str, bytes: &[u8]) -> Result<(), Errno> {
        let path = clean(path)?;
        let queue = match self.lock().get(&path) {
            Some(Node::Stream { queue, .. }) => queue.clone(),
            Some(_) => return Err(Errno::EINVAL),
            None => return Err(Errno::ENOENT),
        };
        queue
            .bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(bytes);
        queue.ready.notify_all();
        Ok(())
    }

    /// The current content of a regular file.
    pub fn content(&self, path: &str) -> Result<Vec<u8>, Errno> {
        match self.lock().get(&clean(path)?) {
            Some(Node::File { content, .. }) => Ok(content.clone()),
            Some(_) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Node>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl FileSystem for MemFs {
    fn stat(&self, path: &str) -> Result<Stat, Errno> {
        match self.lock().get(&clean(path)?) {
            Some(Node::Dir { mode, .. }) => Ok(Stat {
                kind: FileKind::Dir,
                mode: *mode,
            }),
            Some(Node::File { mode, .. } | Node::Stream { mode, .. }) => Ok(Stat {
                kind: FileKind::File,
                mode: *mode,
            }),
            None => Err(Errno::ENOENT),
        }
    }

    fn readdir(&self, path: &str) -> Result<Vec<DirEntry>, Errno> {
        let path = clean(path)?;
        let nodes = self.lock();
        match nodes.get(&path) {
            Some(Node::Dir { .. }) => {}
            Some(_) => return Err(Errno::ENOTDIR),
            None => return Err(Errno::ENOENT),
        }
        let mut out = Vec::new();
        for (p, node) in nodes.iter() {
            if p.is_empty() || parent_of(p) != path {
                continue;
            }
            let name = p.rsplit('/').next().unwrap_or(p).to_owned();
            let kind = if matches!(node, Node::Dir { .. }) {
                FileKind::Dir
            } else {
                FileKind::File
            };
            out.push(DirEntry { name, kind });
        }
        Ok(out)
    }

    fn open(&self, path: &str, flags: OpenFlags) -> Result<Box<dyn OpenFile>, Errno> {
        let path = clean(path)?;
        let mut nodes = self.lock();
        match nodes.get_mut(&path) {
            None => Err(Errno::ENOENT),
            Some(Node::Dir { .. }) => Err(Errno::EISDIR),
            Some(Node::Stream { queue, .. }) => Ok(Box::new(MemStream {
                queue: queue.clone(),
                nonblock: flags.nonblock,
            })),
            Some(Node::File { content, mode, .. }) => {
                if flags.write && *mode & 0o200 == 0 {
                    return Err(Errno::EACCES);
                }
                if flags.write && flags.truncate {
                    content.clear();
                }
                Ok(Box::new(MemFile {
                    nodes: self.nodes.clone(),
                    path,
                    snapshot: if flags.read {
                        content.clone()
                    } else {
                        Vec::new()
                    },
                    pos: 0,
                    append: flags.append,
                    wrote: false,
                }))
            }
        }
    }

    fn mkdir(&self, path: &str) -> Result<(), Errno> {
        let path = clean(path)?;
        let mut nodes = self.lock();
        if nodes.contains_key(&path) {
            return Err(Errno::EEXIST);
        }
        match nodes.get(parent_of(&path)) {
            Some(Node::Dir {
                makes_children: true,
                ..
            }) => {}
            Some(Node::Dir { .. }) => return Err(Errno::EPERM),
            Some(_) => return Err(Errno::ENOTDIR),
            None => return Err(Errno::ENOENT),
        }
        nodes.insert(
            path.clone(),
            Node::Dir {
                mode: 0o755,
                makes_children: false,
            },
        );
        let trace = Node::File {
            mode: 0o644,
            content: b"# tracer: nop\n".to_vec(),
            check: None,
        };
        nodes.insert(format!("{path}/trace"), trace);
        let on = Node::File {
            mode: 0o644,
            content: b"1\n".to_vec(),
            check: Some(accepts_zero_or_one),
        };
        nodes.insert(format!("{path}/tracing_on"), on);
        Ok(())
    }

    fn rmdir(&self, path: &str) -> Result<(), Errno> {
        let path = clean(path)?;
        let mut nodes = self.lock();
        match nodes.get(&path) {
            Some(Node::Dir { .. }) => {}
            Some(_) => return Err(Errno::ENOTDIR),
            None => return Err(Errno::ENOENT),
        }
        if !matches!(
            nodes.get(parent_of(&path)),
            Some(Node::Dir {
                makes_children: true,
                ..
            })
        ) {
            return Err(Errno::EPERM);
        }
        let prefix = format!("{path}/");
        nodes.retain(|p, _| *p != path && !p.starts_with(&prefix));
        Ok(())
    }
}

struct MemFile {
    nodes: Arc<Mutex<BTreeMap<String, Node>>>,
    path: String,
    snapshot: Vec<u8>,
    pos: usize,
    append: bool,
    wrote: bool,
}

impl OpenFile for MemFile {
    fn read(&mut self, buf: &mut [u8], _timeout: Option<Duration>) -> Result<usize, Errno> {
        let rest = &self.snapshot[self.pos.min(self.snapshot.len())..];
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.pos += n;
        Ok(n)
    }

    fn write(&mut self, data: &[u8]) -> Result<usize, Errno> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(Node::File { content, check, .. }) = nodes.get_mut(&self.path) else {
            return Err(Errno::ENOENT);
        };
        if let Some(check) = check {
            if !check(data) {
                return Err(Errno::EINVAL);
            }
        }
        // The first write of a plain open replaces the value, as a control file's would;
        // later chunks of the same open, and every chunk of an O_APPEND open, add to it.
        if !self.append && !self.wrote {
            content.clear();
        }
        content.extend_from_slice(data);
        self.wrote = true;
        Ok(data.len())
    }

    fn is_stream(&self) -> bool {
        false
    }
}

struct MemStream {
    queue: Arc<StreamQueue>,
    nonblock: bool,
}

impl OpenFile for MemStream {
    fn read(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> Result<usize, Errno> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut bytes = self.queue.bytes.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if !bytes.is_empty() {
                let n = bytes.len().min(buf.len());
                for (slot, b) in buf.iter_mut().zip(bytes.drain(..n)) {
                    *slot = b;
                }
                return Ok(n);
            }
            if self.nonblock {
                return Err(Errno::EAGAIN);
            }
            bytes = match deadline {
                None => self
                    .queue
                    .ready
                    .wait(bytes)
                    .unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(Errno::EAGAIN);
                    }
                    self.queue
                        .ready
                        .wait_timeout(bytes, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }

    fn write(&mut self, data: &[u8]) -> Result<usize, Errno> {
        self.queue
            .bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(data);
        self.queue.ready.notify_all();
        Ok(data.len())
    }

    fn is_stream(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(fs: &MemFs, path: &str) -> Vec<u8> {
        let mut f = fs.open(path, OpenFlags::READ).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 7];
        loop {
            let n = f.read(&mut buf, None).unwrap();
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn truncate_append_and_refused_writes() {
        let fs = MemFs::sample();
        assert_eq!(read_all(&fs, "/trace"), b"# tracer: nop\n");
        fs.open("trace", OpenFlags::TRUNCATE).unwrap();
        assert_eq!(read_all(&fs, "trace"), b"");
        let mut f = fs
            .open("events/sched/sched_switch/filter", OpenFlags::TRUNCATE)
            .unwrap();
        assert_eq!(f.write(b"x > 1"), Err(Errno::EINVAL));
        assert_eq!(f.write(b"prev_pid > 1\n"), Ok(13));
        drop(f);
        let mut f = fs.open("trace", OpenFlags::APPEND).unwrap();
        f.write(b"a\n").unwrap();
        let mut f = fs.open("trace", OpenFlags::APPEND).unwrap();
        f.write(b"b\n").unwrap();
        assert_eq!(fs.content("trace").unwrap(), b"a\nb\n");
        assert_eq!(
            fs.content("events/sched/sched_switch/filter").unwrap(),
            b"prev_pid > 1\n"
        );
        let ro = OpenFlags {
            write: true,
            ..OpenFlags::default()
        };
        assert_eq!(
            fs.open("events/sched/sched_switch/format", ro).err(),
            Some(Errno::EACCES)
        );
    }

    #[test]
    fn snapshot_is_taken_at_open() {
        let fs = MemFs::sample();
        let mut reader = fs.open("tracing_on", OpenFlags::READ).unwrap();
        fs.open("tracing_on", OpenFlags::TRUNCATE)
            .unwrap()
            .write(b"0")
            .unwrap();
        let mut buf = [0u8; 8];
        let n = reader.read(&mut buf, None).unwrap();
        assert_eq!(&buf[..n], b"1\n");
    }

    #[test]
    fn mkdir_rmdir_and_listing() {
        let fs = MemFs::sample();
        fs.mkdir("instances/foo").unwrap();
        assert_eq!(fs.mkdir("instances/foo"), Err(Errno::EEXIST));
        assert_eq!(fs.mkdir("events/foo"), Err(Errno::EPERM));
        assert_eq!(fs.mkdir("instances/../x"), Err(Errno::EINVAL));
        let names: Vec<String> = fs
            .readdir("instances/foo")
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["trace", "tracing_on"]);
        assert_eq!(fs.readdir("trace"), Err(Errno::ENOTDIR));
        fs.rmdir("instances/foo").unwrap();
        assert_eq!(fs.stat("instances/foo/trace"), Err(Errno::ENOENT));
        assert_eq!(fs.rmdir("events"), Err(Errno::EPERM));
    }

    #[test]
    fn stream_blocks_until_pushed_and_times_out() {
        let fs = Arc::new(MemFs::sample());
        let mut pipe = fs.open("trace_pipe", OpenFlags::READ).unwrap();
        assert!(pipe.is_stream());
        let mut buf = [0u8; 16];
        let start = Instant::now();
        assert_eq!(
            pipe.read(&mut buf, Some(Duration::from_millis(30))),
            Err(Errno::EAGAIN)
        );
        assert!(start.elapsed() >= Duration::from_millis(30));
        let pusher = {
            let fs = fs.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                fs.push("trace_pipe", b"hello").unwrap();
            })
        };
        let n = pipe.read(&mut buf, None).unwrap();
        assert_eq!(&buf[..n], b"hello");
        pusher.join().unwrap();
        let nb = OpenFlags {
            nonblock: true,
            ..OpenFlags::READ
        };
        let mut pipe = fs.open("trace_pipe", nb).unwrap();
        assert_eq!(pipe.read(&mut buf, None), Err(Errno::EAGAIN));
    }
}
