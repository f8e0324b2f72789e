//! The file tree the mount serves, the log of every operation that changes
//! it, and what a power cut after any prefix of that log leaves behind.
//!
//! The durability model is the strictest a POSIX file system allows:
//! - a file's bytes (and size) survive as of its last `fsync`/`fdatasync`,
//!   or not at all (an empty file) if it was never synced;
//! - a directory's entries survive as of its last `fsync`, or not at all if
//!   it was never synced (so a new file whose directory was never synced is
//!   lost, whatever its own fsyncs; a rename or unlink is undone);
//! - nothing else survives: unsynced writes, truncations, creations, renames
//!   and removals are all lost.
//!
//! Between two syncs the surviving state does not change, so a cut after any
//! operation leaves what a cut right after the last sync before it leaves.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use fuser::Errno;

use crate::content::Content;

/// The inode number of the mount's root directory.
pub const ROOT: u64 = 1;

#[derive(Clone, Debug)]
pub enum Body {
    File(Content),
    Dir(BTreeMap<OsString, u64>),
    Symlink(PathBuf),
}

#[derive(Clone, Debug)]
pub struct Node {
    pub body: Body,
    pub perm: u16,
    pub nlink: u32,
    /// Kernel references (lookups not yet forgotten): an unlinked file's bytes
    /// stay readable until the kernel lets go of it.
    lookups: u64,
    /// Where it was last linked, to name it in the log.
    parent: u64,
    name: OsString,
}

/// What an operation did. Paths are relative to the mount's root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    Create,
    Mkdir,
    Symlink,
    Link {
        to: PathBuf,
    },
    Write {
        offset: u64,
        len: u64,
    },
    Truncate {
        size: u64,
    },
    Chmod {
        mode: u16,
    },
    Fallocate {
        offset: u64,
        len: u64,
        mode: i32,
    },
    Rename {
        to: PathBuf,
    },
    Unlink,
    Rmdir,
    /// `fsync` or `fdatasync` of a file: its bytes become durable.
    Fsync,
    /// `fsync` of a directory: its entries become durable.
    Fsyncdir,
}

/// One logged operation: what it did, and to which path (where the file was
/// linked when it happened).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub kind: OpKind,
    pub path: PathBuf,
}

impl Op {
    /// Whether the operation changes what survives a cut.
    pub fn is_sync(&self) -> bool {
        matches!(self.kind, OpKind::Fsync | OpKind::Fsyncdir)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.path.display();
        match &self.kind {
            OpKind::Create => write!(f, "create {p}"),
            OpKind::Mkdir => write!(f, "mkdir {p}"),
            OpKind::Symlink => write!(f, "symlink {p}"),
            OpKind::Link { to } => write!(f, "link {p} -> {}", to.display()),
            OpKind::Write { offset, len } => write!(f, "write {p} [{offset}, +{len})"),
            OpKind::Truncate { size } => write!(f, "truncate {p} to {size}"),
            OpKind::Chmod { mode } => write!(f, "chmod {p} {mode:o}"),
            OpKind::Fallocate { offset, len, mode } => {
                write!(f, "fallocate {p} [{offset}, +{len}) mode {mode:#x}")
            }
            OpKind::Rename { to } => write!(f, "rename {p} -> {}", to.display()),
            OpKind::Unlink => write!(f, "unlink {p}"),
            OpKind::Rmdir => write!(f, "rmdir {p}"),
            OpKind::Fsync => write!(f, "fsync {p}"),
            OpKind::Fsyncdir => write!(f, "fsyncdir {p}"),
        }
    }
}

/// A directory's entries: name to inode.
type Entries = BTreeMap<OsString, u64>;

/// The live tree, the log, and every sync's snapshot.
#[derive(Debug)]
pub struct Tree {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    log: Vec<Op>,
    /// Per file: the log index of each fsync and the file's bytes then.
    file_syncs: HashMap<u64, Vec<(usize, Content)>>,
    /// Per directory: the log index of each fsync and its entries then.
    dir_syncs: HashMap<u64, Vec<(usize, Entries)>>,
}

impl Default for Tree {
    fn default() -> Self {
        let root = Node {
            body: Body::Dir(BTreeMap::new()),
            perm: 0o755,
            nlink: 2,
            lookups: 1,
            parent: ROOT,
            name: OsString::new(),
        };
        Tree {
            nodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
            log: Vec::new(),
            file_syncs: HashMap::new(),
            dir_syncs: HashMap::new(),
        }
    }
}

fn enoent() -> Errno {
    Errno::ENOENT
}

impl Tree {
    pub fn log(&self) -> &[Op] {
        &self.log
    }

    pub fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.nodes.get(&ino).ok_or_else(enoent)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or_else(enoent)
    }

    fn entries(&self, dir: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
        match &self.node(dir)?.body {
            Body::Dir(e) => Ok(e),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match &mut self.node_mut(dir)?.body {
            Body::Dir(e) => Ok(e),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn content_mut(&mut self, ino: u64) -> Result<&mut Content, Errno> {
        match &mut self.node_mut(ino)?.body {
            Body::File(c) => Ok(c),
            Body::Dir(_) => Err(Errno::EISDIR),
            Body::Symlink(_) => Err(Errno::EINVAL),
        }
    }

    /// The node's path relative to the root, as last linked.
    pub fn path_of(&self, ino: u64) -> PathBuf {
        let mut parts = Vec::new();
        let mut at = ino;
        while at != ROOT && parts.len() < 256 {
            let Some(n) = self.nodes.get(&at) else { break };
            parts.push(n.name.clone());
            at = n.parent;
        }
        parts.iter().rev().collect()
    }

    fn child_path(&self, dir: u64, name: &OsStr) -> PathBuf {
        self.path_of(dir).join(name)
    }

    fn record(&mut self, kind: OpKind, path: PathBuf) {
        self.log.push(Op { kind, path });
    }

    /// The kernel learnt of `ino` (a lookup or a creation it was told of).
    pub fn remember(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.lookups += 1;
        }
    }

    /// The kernel dropped `n` references; an unlinked file's bytes go with
    /// the last one (its syncs' snapshots stay for the cuts).
    pub fn forget(&mut self, ino: u64, n: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
            if node.lookups == 0 && node.nlink == 0 {
                if let Body::File(c) = &mut node.body {
                    *c = Content::default();
                }
            }
        }
    }

    pub fn lookup(&self, dir: u64, name: &OsStr) -> Result<u64, Errno> {
        self.entries(dir)?.get(name).copied().ok_or_else(enoent)
    }

    fn add(&mut self, dir: u64, name: &OsStr, body: Body, perm: u16) -> Result<u64, Errno> {
        if self.entries(dir)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let nlink = if matches!(body, Body::Dir(_)) { 2 } else { 1 };
        let node = Node {
            body,
            perm,
            nlink,
            lookups: 0,
            parent: dir,
            name: name.to_owned(),
        };
        self.nodes.insert(ino, node);
        self.entries_mut(dir)?.insert(name.to_owned(), ino);
        Ok(ino)
    }

    pub fn create(&mut self, dir: u64, name: &OsStr, perm: u16) -> Result<u64, Errno> {
        let ino = self.add(dir, name, Body::File(Content::default()), perm)?;
        self.record(OpKind::Create, self.child_path(dir, name));
        Ok(ino)
    }

    pub fn mkdir(&mut self, dir: u64, name: &OsStr, perm: u16) -> Result<u64, Errno> {
        let ino = self.add(dir, name, Body::Dir(BTreeMap::new()), perm)?;
        self.record(OpKind::Mkdir, self.child_path(dir, name));
        Ok(ino)
    }

    pub fn symlink(&mut self, dir: u64, name: &OsStr, target: &Path) -> Result<u64, Errno> {
        let ino = self.add(dir, name, Body::Symlink(target.to_owned()), 0o777)?;
        self.record(OpKind::Symlink, self.child_path(dir, name));
        Ok(ino)
    }

    pub fn link(&mut self, ino: u64, dir: u64, name: &OsStr) -> Result<(), Errno> {
        if matches!(self.node(ino)?.body, Body::Dir(_)) {
            return Err(Errno::EPERM);
        }
        if self.entries(dir)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        self.entries_mut(dir)?.insert(name.to_owned(), ino);
        self.node_mut(ino)?.nlink += 1;
        let from = self.path_of(ino);
        self.record(
            OpKind::Link {
                to: self.child_path(dir, name),
            },
            from,
        );
        Ok(())
    }

    /// Drops one link to `ino` (its entry is already gone).
    fn unlinked(&mut self, ino: u64) -> Result<(), Errno> {
        let node = self.node_mut(ino)?;
        node.nlink = if matches!(node.body, Body::Dir(_)) {
            0
        } else {
            node.nlink.saturating_sub(1)
        };
        if node.nlink == 0 && node.lookups == 0 {
            if let Body::File(c) = &mut node.body {
                *c = Content::default();
            }
        }
        Ok(())
    }

    pub fn unlink(&mut self, dir: u64, name: &OsStr) -> Result<(), Errno> {
        let ino = self.lookup(dir, name)?;
        if matches!(self.node(ino)?.body, Body::Dir(_)) {
            return Err(Errno::EISDIR);
        }
        let path = self.child_path(dir, name);
        self.entries_mut(dir)?.remove(name);
        self.unlinked(ino)?;
        self.record(OpKind::Unlink, path);
        Ok(())
    }

    pub fn rmdir(&mut self, dir: u64, name: &OsStr) -> Result<(), Errno> {
        let ino = self.lookup(dir, name)?;
        if !self.entries(ino)?.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        let path = self.child_path(dir, name);
        self.entries_mut(dir)?.remove(name);
        self.unlinked(ino)?;
        self.record(OpKind::Rmdir, path);
        Ok(())
    }

    /// `rename(2)`, replacing an existing target unless `noreplace`.
    pub fn rename(
        &mut self,
        dir: u64,
        name: &OsStr,
        to_dir: u64,
        to_name: &OsStr,
        noreplace: bool,
    ) -> Result<(), Errno> {
        let ino = self.lookup(dir, name)?;
        let is_dir = matches!(self.node(ino)?.body, Body::Dir(_));
        if is_dir && self.is_within(to_dir, ino) {
            return Err(Errno::EINVAL);
        }
        if let Ok(old) = self.lookup(to_dir, to_name) {
            if noreplace {
                return Err(Errno::EEXIST);
            }
            // Two names of one file: rename(2) does nothing.
            if old == ino {
                return Ok(());
            }
            match (&self.node(old)?.body, is_dir) {
                (Body::Dir(e), true) if !e.is_empty() => return Err(Errno::ENOTEMPTY),
                (Body::Dir(_), false) => return Err(Errno::EISDIR),
                (Body::File(_) | Body::Symlink(_), true) => return Err(Errno::ENOTDIR),
                _ => {}
            }
            self.unlinked(old)?;
        }
        let from = self.child_path(dir, name);
        self.entries_mut(dir)?.remove(name);
        self.entries_mut(to_dir)?.insert(to_name.to_owned(), ino);
        let node = self.node_mut(ino)?;
        node.parent = to_dir;
        node.name = to_name.to_owned();
        let to = self.path_of(ino);
        self.record(OpKind::Rename { to }, from);
        Ok(())
    }

    /// Whether `dir` is `ancestor` or below it.
    fn is_within(&self, dir: u64, ancestor: u64) -> bool {
        let mut at = dir;
        for _ in 0..256 {
            if at == ancestor {
                return true;
            }
            if at == ROOT {
                return false;
            }
            at = self.nodes.get(&at).map_or(ROOT, |n| n.parent);
        }
        false
    }

    pub fn read(&self, ino: u64, offset: u64, len: usize) -> Result<Vec<u8>, Errno> {
        match &self.node(ino)?.body {
            Body::File(c) => Ok(c.read(offset, len)),
            Body::Dir(_) => Err(Errno::EISDIR),
            Body::Symlink(_) => Err(Errno::EINVAL),
        }
    }

    pub fn readlink(&self, ino: u64) -> Result<PathBuf, Errno> {
        match &self.node(ino)?.body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => Err(Errno::EINVAL),
        }
    }

    pub fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<(), Errno> {
        self.content_mut(ino)?.write(offset, data);
        let kind = OpKind::Write {
            offset,
            len: data.len() as u64,
        };
        self.record(kind, self.path_of(ino));
        Ok(())
    }

    pub fn set_len(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        self.content_mut(ino)?.set_len(size);
        self.record(OpKind::Truncate { size }, self.path_of(ino));
        Ok(())
    }

    pub fn set_perm(&mut self, ino: u64, perm: u16) -> Result<(), Errno> {
        self.node_mut(ino)?.perm = perm;
        self.record(OpKind::Chmod { mode: perm }, self.path_of(ino));
        Ok(())
    }

    /// `fallocate(2)`: plain allocation (which may extend the file), with
    /// `FALLOC_FL_KEEP_SIZE` (nothing visible: RocksDB preallocates this way),
    /// or a punched hole.
    pub fn fallocate(&mut self, ino: u64, offset: u64, len: u64, mode: i32) -> Result<(), Errno> {
        let c = self.content_mut(ino)?;
        match mode {
            0 if offset + len > c.size() => c.set_len(offset + len),
            0 | libc::FALLOC_FL_KEEP_SIZE => {}
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => c.zero(offset, len),
            _ => return Err(Errno::EOPNOTSUPP),
        }
        self.record(OpKind::Fallocate { offset, len, mode }, self.path_of(ino));
        Ok(())
    }

    /// `fsync` of a file (or of a directory opened as one).
    pub fn fsync(&mut self, ino: u64) -> Result<(), Errno> {
        let at = self.log.len();
        match &self.node(ino)?.body {
            Body::File(c) => {
                let snapshot = c.clone();
                self.file_syncs.entry(ino).or_default().push((at, snapshot));
                self.record(OpKind::Fsync, self.path_of(ino));
                Ok(())
            }
            Body::Dir(_) => self.fsyncdir(ino),
            // A symlink cannot be opened, so never synced.
            Body::Symlink(_) => Err(Errno::EINVAL),
        }
    }

    pub fn fsyncdir(&mut self, ino: u64) -> Result<(), Errno> {
        let at = self.log.len();
        let entries = self.entries(ino)?.clone();
        self.dir_syncs.entry(ino).or_default().push((at, entries));
        self.record(OpKind::Fsyncdir, self.path_of(ino));
        Ok(())
    }

    /// A directory's entries for `readdir`: (inode, is a directory, name).
    pub fn list(&self, dir: u64) -> Result<Vec<(u64, &Body, &OsStr)>, Errno> {
        self.entries(dir)?
            .iter()
            .map(|(name, ino)| Ok((*ino, &self.node(*ino)?.body, name.as_os_str())))
            .collect()
    }

    /// Writes into `dest` (an empty directory) what survives a power cut
    /// after the first `pos` operations of the log.
    pub fn materialise(&self, pos: usize, dest: &Path) -> std::io::Result<()> {
        let mut linked = HashMap::new();
        let mut stack = vec![ROOT];
        self.materialise_dir(ROOT, pos, dest, &mut linked, &mut stack)
    }

    fn materialise_dir(
        &self,
        dir: u64,
        pos: usize,
        dest: &Path,
        linked: &mut HashMap<u64, PathBuf>,
        stack: &mut Vec<u64>,
    ) -> std::io::Result<()> {
        for (name, ino) in durable(self.dir_syncs.get(&dir), pos).into_iter().flatten() {
            // Every inode ever made stays in `nodes`, so this cannot fail.
            let Some(node) = self.nodes.get(ino) else {
                continue;
            };
            let path = dest.join(name);
            match &node.body {
                // Stale snapshots of moved directories could form a cycle.
                Body::Dir(_) if stack.contains(ino) => {}
                Body::Dir(_) => {
                    std::fs::create_dir(&path)?;
                    stack.push(*ino);
                    self.materialise_dir(*ino, pos, &path, linked, stack)?;
                    stack.pop();
                }
                Body::Symlink(target) => std::os::unix::fs::symlink(target, &path)?,
                Body::File(_) => match linked.get(ino) {
                    Some(first) => std::fs::hard_link(first, &path)?,
                    None => {
                        let mut f = std::fs::File::create(&path)?;
                        if let Some(c) = durable(self.file_syncs.get(ino), pos) {
                            c.write_to(&mut std::io::BufWriter::new(&mut f))?;
                        }
                        linked.insert(*ino, path);
                    }
                },
            }
        }
        Ok(())
    }
}

/// The last snapshot taken by a sync among the first `pos` operations.
fn durable<T>(syncs: Option<&Vec<(usize, T)>>, pos: usize) -> Option<&T> {
    let syncs = syncs?;
    let n = syncs.partition_point(|(at, _)| *at < pos);
    n.checked_sub(1).map(|i| &syncs[i].1)
}

/// A name from the kernel as a path component, refusing what is not one.
pub fn component(name: &OsStr) -> Result<&OsStr, Errno> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree_at(t: &Tree, pos: usize) -> Vec<(String, Vec<u8>)> {
        let d = tempfile::tempdir().unwrap();
        t.materialise(pos, d.path()).unwrap();
        let mut out = Vec::new();
        walk(d.path(), d.path(), &mut out);
        out.sort();
        out
    }

    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if p.is_dir() {
                out.push((rel + "/", Vec::new()));
                walk(root, &p, out);
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }

    fn f(path: &str, bytes: &[u8]) -> (String, Vec<u8>) {
        (path.to_string(), bytes.to_vec())
    }

    #[test]
    fn only_synced_bytes_and_synced_entries_survive() {
        let mut t = Tree::default();
        let d = t.mkdir(ROOT, "d".as_ref(), 0o755).unwrap();
        let a = t.create(d, "a".as_ref(), 0o644).unwrap();
        t.write(a, 0, b"one").unwrap();
        t.fsync(a).unwrap();
        let synced_file = t.log().len();
        t.write(a, 3, b"two").unwrap();
        assert_eq!(tree_at(&t, t.log().len()), vec![], "no directory synced");
        t.fsyncdir(ROOT).unwrap();
        assert_eq!(tree_at(&t, t.log().len()), vec![f("d/", b"")]);
        t.fsyncdir(d).unwrap();
        let both = t.log().len();
        assert_eq!(tree_at(&t, both), vec![f("d/", b""), f("d/a", b"one")]);
        assert_eq!(tree_at(&t, synced_file), vec![], "before the dir syncs");
        // Unlink and rename are lost until their directory is synced.
        t.rename(d, "a".as_ref(), ROOT, "b".as_ref(), false)
            .unwrap();
        t.fsyncdir(ROOT).unwrap();
        assert_eq!(
            tree_at(&t, t.log().len()),
            vec![f("b", b"one"), f("d/", b""), f("d/a", b"one")],
            "the old entry stays until d is synced (one inode, two names)"
        );
        t.fsyncdir(d).unwrap();
        t.fsync(a).unwrap();
        assert_eq!(
            tree_at(&t, t.log().len()),
            vec![f("b", b"onetwo"), f("d/", b"")]
        );
        t.unlink(ROOT, "b".as_ref()).unwrap();
        assert_eq!(tree_at(&t, t.log().len()).len(), 2);
        t.fsyncdir(ROOT).unwrap();
        assert_eq!(tree_at(&t, t.log().len()), vec![f("d/", b"")]);
    }

    #[test]
    fn rename_over_replaces_only_once_synced() {
        let mut t = Tree::default();
        for (name, bytes) in [("m", b"old"), ("m.new", b"new")] {
            let i = t.create(ROOT, name.as_ref(), 0o644).unwrap();
            t.write(i, 0, bytes).unwrap();
            t.fsync(i).unwrap();
            if name == "m" {
                t.fsyncdir(ROOT).unwrap();
            }
        }
        t.rename(ROOT, "m.new".as_ref(), ROOT, "m".as_ref(), false)
            .unwrap();
        let renamed = t.log().len();
        t.fsyncdir(ROOT).unwrap();
        assert_eq!(tree_at(&t, renamed), vec![f("m", b"old")]);
        assert_eq!(tree_at(&t, t.log().len()), vec![f("m", b"new")]);
        assert_eq!(
            t.rename(ROOT, "m".as_ref(), ROOT, "m".as_ref(), true),
            Err(Errno::EEXIST)
        );
    }
}
