//! The one way a restore writes a directory tree, whatever the catalog or tar
//! stream says: nothing is created, written, linked, chmod-ed, chown-ed or
//! touched outside the target, and no symlink is ever followed.
//!
//! Every entry is made relative to an open descriptor of its parent
//! directory, reached from the target one component at a time with
//! `O_DIRECTORY | O_NOFOLLOW` (a symlink where a directory should be fails
//! the open instead of leading elsewhere), by the `*at` system calls that do
//! not follow a final symlink: `openat` with `O_CREAT | O_EXCL`, `mkdirat`,
//! `symlinkat`, `linkat` without `AT_SYMLINK_FOLLOW`, `mknodat`. Metadata is
//! applied through descriptors of what the restore itself made (`fchown`,
//! `fchmod`, `futimens`), or with `AT_SYMLINK_NOFOLLOW` for symlinks; device
//! nodes and FIFOs are never opened for reading or writing.
//!
//! On top of that, every entry passes [`TreeCheck`] before anything is made:
//! an entry below a symlink (or any non-directory), a path listed twice, a
//! hard link to anything but an earlier regular file, or a path with `..`,
//! a leading `/` or empty components is refused with an error naming it.
//!
//! We use `rustix` (already in the build through `tempfile`) rather than
//! `cap-std`: it is a thin, safe wrapper of exactly these system calls,
//! `mknodat` and `fchownat` included, whereas `cap-std` resolves paths inside
//! its sandbox itself (following symlinks that stay inside) and has no
//! device nodes or ownership.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, Gid, Mode, OFlags, Timestamps, Uid, CWD};
use rustix::io::Errno;

use super::EntryHandler;
use crate::error::{Error, IoContext, Result};
use crate::format::catalog::{Checked, Entry, Kind, TreeCheck};

/// A directory's mode while the restore fills it: only the restoring user
/// may enter it. Its own mode is applied once its contents are in place.
const WORKING_DIR_MODE: u32 = 0o700;

/// The final mode of a parent directory the catalog does not list.
const IMPLIED_DIR_MODE: u32 = 0o755;

/// Directory descriptors kept open at most (trees can be deeper).
const MAX_OPEN_DIRS: usize = 64;

/// Writes entries in stream order into a target directory; see the module
/// documentation.
pub(super) struct DirWriter {
    root: PathBuf,
    dirs: DirStack,
    check: TreeCheck,
    /// The regular file receiving data.
    file: Option<File>,
    /// Directories to finish, by path: their listed metadata, or `None` for
    /// an implied parent. Applied in reverse path order, so every directory
    /// after what lies below it (a path sorts before its descendants).
    dir_meta: BTreeMap<Vec<u8>, Option<Meta>>,
    /// Only root may give files away; others keep their own uid.
    restore_owners: bool,
    pub(super) warnings: Vec<String>,
}

/// The metadata a restore applies.
#[derive(Clone, Copy)]
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime_sec: i64,
    mtime_nsec: u32,
}

impl Meta {
    fn of(e: &Entry) -> Meta {
        Meta {
            mode: e.mode & 0o7777,
            uid: e.uid,
            gid: e.gid,
            mtime_sec: e.mtime_sec,
            mtime_nsec: e.mtime_nsec,
        }
    }

    fn times(&self) -> Timestamps {
        let t = rfs::Timespec {
            tv_sec: self.mtime_sec,
            tv_nsec: i64::from(self.mtime_nsec.min(999_999_999)),
        };
        Timestamps {
            last_access: t,
            last_modification: t,
        }
    }

    /// Owner and group; `u32::MAX` (-1) means "leave as is" to chown.
    fn owners(&self) -> (Option<Uid>, Option<Gid>) {
        (
            (self.uid != u32::MAX).then(|| Uid::from_raw(self.uid)),
            (self.gid != u32::MAX).then(|| Gid::from_raw(self.gid)),
        )
    }

    fn mode(&self) -> Mode {
        Mode::from_raw_mode(self.mode)
    }
}

/// The error for an entry that cannot be part of the tree.
pub(super) fn refused(root: &Path, why: &str) -> Error {
    Error::CorruptMetadata {
        what: "catalog".into(),
        detail: format!("refusing to restore into {}: entry {why}", root.display()),
    }
}

fn quoted(p: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(p))
}

/// (parent, name) of a non-empty clean path.
fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// Opens directory `name` below `base`, never through a symlink.
fn open_dir(base: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rfs::openat(base, name, flags, Mode::empty()).map_err(|e| {
        if e == Errno::LOOP || e == Errno::NOTDIR {
            io::Error::new(
                io::ErrorKind::NotADirectory,
                format!(
                    "{} is not a directory (a symlink is never followed)",
                    quoted(name)
                ),
            )
        } else {
            e.into()
        }
    })
}

/// fchown (as root), fchmod, futimens on an open descriptor. Owner first:
/// a chown clears setuid and setgid bits.
fn apply(fd: BorrowedFd<'_>, m: &Meta, owners: bool) -> io::Result<()> {
    if owners {
        let (u, g) = m.owners();
        rfs::fchown(fd, u, g)?;
    }
    rfs::fchmod(fd, m.mode())?;
    rfs::futimens(fd, &m.times())?;
    Ok(())
}

impl DirWriter {
    /// `root` must not exist or be an empty directory (a `lost+found` is
    /// allowed). Symlinks in `root` itself are the caller's own and are
    /// followed; nothing below it is.
    pub(super) fn new(root: &Path) -> Result<Self> {
        match fs::read_dir(root) {
            Ok(mut it) => {
                if it.any(|e| e.map(|e| e.file_name() != "lost+found").unwrap_or(true)) {
                    return Err(Error::Invalid(format!(
                        "restore target {} is not empty; restore into a new or empty directory",
                        root.display()
                    )));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(root).ctx(|| format!("creating {}", root.display()))?
            }
            Err(e) => {
                return Err(Error::Io {
                    context: format!("reading {}", root.display()),
                    source: e,
                })
            }
        }
        let fd = rfs::openat(
            CWD,
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io::Error::from)
        .ctx(|| format!("opening {}", root.display()))?;
        Ok(DirWriter {
            root: root.to_path_buf(),
            dirs: DirStack {
                root: fd,
                levels: Vec::new(),
            },
            check: TreeCheck::new(),
            file: None,
            dir_meta: BTreeMap::new(),
            // SAFETY: geteuid has no preconditions and cannot fail.
            restore_owners: unsafe { libc::geteuid() } == 0,
            warnings: Vec::new(),
        })
    }

    fn io_err(&self, path: &[u8], source: io::Error) -> Error {
        Error::Io {
            context: format!("restoring {} into {}", quoted(path), self.root.display()),
            source,
        }
    }

    /// Creates one entry (a file is left open for its data).
    fn create(&mut self, e: &Entry) -> io::Result<()> {
        let (parent, name) = split(&e.path);
        // A hard link's source, opened on its own path from the root.
        let source = match e.kind {
            Kind::Hardlink => Some(self.link_source(&e.link)?),
            _ => None,
        };
        let mut made = Vec::new();
        let at = self.dirs.open(parent, true, &mut made)?;
        for p in made {
            self.dir_meta.entry(p).or_insert(None);
        }
        let m = Meta::of(e);
        match e.kind {
            Kind::Dir => {
                match rfs::mkdirat(at, name, Mode::from_raw_mode(WORKING_DIR_MODE)) {
                    // Implied by an earlier entry (or the target's lost+found).
                    Err(Errno::EXIST) => drop(open_dir(at, name)?),
                    r => r?,
                }
                self.dir_meta.insert(e.path.clone(), Some(m));
            }
            Kind::File => {
                let flags = OFlags::WRONLY
                    | OFlags::CREATE
                    | OFlags::EXCL
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC;
                let fd = rfs::openat(at, name, flags, Mode::from_raw_mode(0o600))?;
                self.file = Some(File::from(fd));
            }
            Kind::Symlink => {
                // The target is content: recreated as it is, never resolved.
                rfs::symlinkat(&e.link[..], at, name)?;
                if self.restore_owners {
                    let (u, g) = m.owners();
                    rfs::chownat(at, name, u, g, AtFlags::SYMLINK_NOFOLLOW)?;
                }
                rfs::utimensat(at, name, &m.times(), AtFlags::SYMLINK_NOFOLLOW)?;
            }
            Kind::Hardlink => {
                let (dir, src) = source.expect("opened above");
                // No AT_SYMLINK_FOLLOW: the link is to the file itself.
                rfs::linkat(&dir, src, at, name, AtFlags::empty())?;
            }
            Kind::Fifo | Kind::CharDev | Kind::BlockDev => {
                let made = make_node(at, name, e, &m, self.restore_owners)?;
                if let Some(w) = made {
                    self.warnings.push(format!("{}: {w}", e.path_str()));
                }
            }
        }
        Ok(())
    }

    /// The parent directory and name of a hard link's source, which must
    /// be a regular file (the checks say the catalog made one there; this
    /// makes sure the filesystem agrees).
    fn link_source<'a>(&self, link: &'a [u8]) -> io::Result<(OwnedFd, &'a [u8])> {
        let (parent, name) = split(link);
        let mut dir = open_dir(self.dirs.root.as_fd(), b".")?;
        for c in parent.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            dir = open_dir(dir.as_fd(), c)?;
        }
        let st = rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io::Error::other(format!(
                "the hard link's source {} is not a regular file",
                quoted(link)
            )));
        }
        Ok((dir, name))
    }

    /// Applies each directory's metadata, below before above.
    fn finish_dirs(&mut self) -> Result<()> {
        let dirs = std::mem::take(&mut self.dir_meta);
        for (path, meta) in dirs.into_iter().rev() {
            self.finish_dir(&path, meta.as_ref())
                .map_err(|e| self.io_err(&path, e))?;
        }
        Ok(())
    }

    fn finish_dir(&mut self, path: &[u8], meta: Option<&Meta>) -> io::Result<()> {
        let fd = if path.is_empty() {
            open_dir(self.dirs.root.as_fd(), b".")?
        } else {
            let (parent, name) = split(path);
            let at = self.dirs.open(parent, false, &mut Vec::new())?;
            open_dir(at, name)?
        };
        match meta {
            Some(m) => apply(fd.as_fd(), m, self.restore_owners),
            None => rfs::fchmod(&fd, Mode::from_raw_mode(IMPLIED_DIR_MODE)).map_err(Into::into),
        }
    }
}

/// Makes a FIFO or device node and applies its metadata without opening it.
/// Returns a warning when the node cannot be made without privileges.
fn make_node(
    at: BorrowedFd<'_>,
    name: &[u8],
    e: &Entry,
    m: &Meta,
    owners: bool,
) -> io::Result<Option<&'static str>> {
    let ft = match e.kind {
        Kind::Fifo => FileType::Fifo,
        Kind::CharDev => FileType::CharacterDevice,
        _ => FileType::BlockDevice,
    };
    match rfs::mknodat(at, name, ft, Mode::from_raw_mode(0o600), e.rdev) {
        Err(Errno::PERM) => return Ok(Some("cannot create a device node without privileges")),
        r => r?,
    }
    if owners {
        let (u, g) = m.owners();
        rfs::chownat(at, name, u, g, AtFlags::SYMLINK_NOFOLLOW)?;
    }
    // Linux's fchmodat cannot refuse to follow a symlink (before
    // fchmodat2), so the mode goes through an O_PATH descriptor of the node
    // just made, which opens nothing, by its /proc/self/fd link.
    let fd = rfs::openat(
        at,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if FileType::from_raw_mode(rfs::fstat(&fd)?.st_mode) != ft {
        return Err(io::Error::other("the node just made was replaced"));
    }
    let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    match rfs::chmodat(CWD, proc_path.as_str(), m.mode(), AtFlags::empty()) {
        Err(Errno::NOENT) => return Ok(Some("mode not restored: /proc is not mounted")),
        r => r?,
    }
    rfs::utimensat(at, name, &m.times(), AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(None)
}

impl EntryHandler for DirWriter {
    fn begin(&mut self, e: &Entry) -> Result<()> {
        match self.check.add(e) {
            Ok(Checked::New) => {}
            Ok(Checked::RepeatedDir) => return Ok(()),
            Err(why) => return Err(refused(&self.root, &why)),
        }
        if e.path.is_empty() {
            // The target itself: its metadata is applied last.
            self.dir_meta.insert(Vec::new(), Some(Meta::of(e)));
            return Ok(());
        }
        self.create(e).map_err(|err| self.io_err(&e.path, err))
    }

    fn data(&mut self, e: &Entry, offset: u64, buf: &[u8]) -> Result<()> {
        let f = self
            .file
            .as_ref()
            .expect("file is open while it receives data");
        f.write_all_at(buf, offset)
            .map_err(|err| self.io_err(&e.path, err))
    }

    fn end_file(&mut self, e: &Entry) -> Result<()> {
        let Some(f) = self.file.take() else {
            return Ok(());
        };
        let done = (|| {
            // Trailing holes of sparse files (and any size not covered by data).
            if f.metadata()?.len() != e.size {
                f.set_len(e.size)?;
            }
            apply(f.as_fd(), &Meta::of(e), self.restore_owners)
        })();
        done.map_err(|err| self.io_err(&e.path, err))
    }

    fn finish(&mut self) -> Result<()> {
        self.finish_dirs()
    }
}

/// The directories from the target down to the last parent used, each opened
/// from the one above it without following symlinks. Consecutive entries
/// mostly share their parent, so most entries cost no open at all.
struct DirStack {
    root: OwnedFd,
    /// (name, descriptor) per level below the root; the shallowest
    /// descriptors are closed past [`MAX_OPEN_DIRS`] and opened again when
    /// the walk comes back to them.
    levels: Vec<(Vec<u8>, Option<OwnedFd>)>,
}

impl DirStack {
    /// The directory at `path` (`""` is the target). With `create`, missing
    /// components are made and their paths added to `made`.
    fn open(
        &mut self,
        path: &[u8],
        create: bool,
        made: &mut Vec<Vec<u8>>,
    ) -> io::Result<BorrowedFd<'_>> {
        let comps: Vec<&[u8]> = if path.is_empty() {
            Vec::new()
        } else {
            path.split(|&b| b == b'/').collect()
        };
        let common = self
            .levels
            .iter()
            .zip(&comps)
            .take_while(|((have, _), want)| have[..] == want[..])
            .count();
        self.levels.truncate(common);
        self.reopen_top()?;
        for (i, &c) in comps.iter().enumerate().skip(common) {
            let base = self.top();
            let fd = match open_dir(base, c) {
                Err(e) if create && e.kind() == io::ErrorKind::NotFound => {
                    rfs::mkdirat(base, c, Mode::from_raw_mode(WORKING_DIR_MODE))?;
                    made.push(comps[..=i].join(&b'/'));
                    open_dir(base, c)?
                }
                r => r?,
            };
            self.levels.push((c.to_vec(), Some(fd)));
            self.bound();
        }
        Ok(self.top())
    }

    fn top(&self) -> BorrowedFd<'_> {
        match self.levels.last() {
            None => self.root.as_fd(),
            Some((_, fd)) => fd.as_ref().expect("the deepest level is open").as_fd(),
        }
    }

    /// Opens again the levels down to the deepest, if its descriptor was
    /// closed.
    fn reopen_top(&mut self) -> io::Result<()> {
        if self.levels.last().is_none_or(|l| l.1.is_some()) {
            return Ok(());
        }
        let from = self
            .levels
            .iter()
            .rposition(|l| l.1.is_some())
            .map_or(0, |i| i + 1);
        for i in from..self.levels.len() {
            let fd = {
                let base = match i {
                    0 => self.root.as_fd(),
                    _ => self.levels[i - 1].1.as_ref().expect("opened").as_fd(),
                };
                open_dir(base, &self.levels[i].0)?
            };
            self.levels[i].1 = Some(fd);
        }
        self.bound();
        Ok(())
    }

    /// Closes the shallowest descriptors past the limit (never the deepest).
    fn bound(&mut self) {
        let mut open = self.levels.iter().filter(|l| l.1.is_some()).count();
        for l in &mut self.levels {
            if open <= MAX_OPEN_DIRS {
                break;
            }
            if l.1.take().is_some() {
                open -= 1;
            }
        }
    }
}
