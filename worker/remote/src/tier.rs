//! Tiering: containers evicted from local disk and read back from the bucket on demand.
//!
//! A container's ends (its header, and its footer and trailer) are what opening it reads;
//! they are kept beside the store (`remote/state`, the *stub*) when a container is evicted,
//! so opening an evicted container costs no request. Its blocks are read by ranged GETs of
//! just the sealed frames that hold them, opened (authenticated) and handed to the engine,
//! which checks each block's CRC as for a local file. A restore announces its next window
//! ([`ColdFile::prefetch`]): those ranges are fetched in the background while the current
//! window is assembled, so the GETs of one window overlap the decoding of the previous one.

use std::ops::Range;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use revault_engine::{live_containers, ColdFile, ColdTier, ContainerId, Store};
use serde::Serialize;

use crate::error::{RemoteError, Result};
use crate::layout;
use crate::seal::{self, Header};
use crate::Remote;

/// Container header, and the trailer's length (the engine's container format).
const CONTAINER_HEADER: u64 = 64;
const CONTAINER_TRAILER: u64 = 32;
/// Prefetched ranges kept per open container (a window's worth is one or two).
const PREFETCH_SLOTS: usize = 4;
/// Whole containers fetched ahead of their opening, at most: a restore asks for 8 (its
/// read-ahead) and withdraws what it will not read; beyond this the oldest are dropped.
const AHEAD_SLOTS: usize = 32;
/// How long a container fetched ahead may wait to be opened: what opens later is read from
/// the bucket again, so no opening (a `check` above all) sees a copy older than this.
const AHEAD_TTL: Duration = Duration::from_secs(30);

/// A container being fetched whole ahead of its opening.
struct Whole {
    id: ContainerId,
    /// The hints not withdrawn yet (restores running at once may ask for the same one).
    askers: usize,
    asked: std::time::Instant,
    /// Its header and plaintext, once the GET and the opening of every frame are done.
    rx: std::sync::mpsc::Receiver<Result<(Header, Vec<u8>)>>,
    task: tokio::task::JoinHandle<()>,
}

pub(crate) struct Tier {
    remote: Remote,
    ahead: Mutex<Vec<Whole>>,
}

impl Tier {
    pub(crate) fn new(remote: Remote) -> Self {
        Tier {
            remote,
            ahead: Mutex::new(Vec::new()),
        }
    }

    /// What a prefetch of container `id` fetched, if one was asked for (waiting for it).
    /// A prefetch that failed gives nothing: the opening reads again, and reports the
    /// error as what it is.
    fn take_whole(&self, id: ContainerId) -> Option<(Header, Vec<u8>)> {
        let w = {
            let mut ahead = self.ahead.lock();
            let i = ahead.iter().position(|w| w.id == id)?;
            ahead.remove(i)
        };
        if w.asked.elapsed() > AHEAD_TTL {
            w.task.abort();
            return None;
        }
        w.rx.recv().ok()?.ok()
    }
}

impl ColdTier for Tier {
    fn open(
        &self,
        id: ContainerId,
        local: &std::path::Path,
    ) -> revault_engine::Result<Box<dyn ColdFile>> {
        if let Some((header, plain)) = self.take_whole(id) {
            if let Some(c) = RemoteContainer::from_whole(&self.remote, id, header, plain) {
                self.remote
                    .inner
                    .whole_opens
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Ok(Box::new(c));
            }
        }
        match RemoteContainer::open(&self.remote, id) {
            Ok(c) => Ok(Box::new(c)),
            Err(RemoteError::NotFound { object }) => Err(revault_engine::Error::MissingContainer {
                container: id.to_string(),
                path: format!("{}, nor in the remote as {object}", local.display()).into(),
            }),
            Err(e) => Err(e.into_engine(&id.to_string())),
        }
    }

    /// Fetches container `id` whole (one GET, header, ends and data), authenticated, in the
    /// background: its opening then costs no request. No more is read than an object of
    /// `file_bytes` can hold, whatever the bucket serves.
    fn prefetch(&self, id: ContainerId, file_bytes: u64) {
        let mut ahead = self.ahead.lock();
        if let Some(w) = ahead.iter_mut().find(|w| w.id == id) {
            w.askers += 1;
            return;
        }
        if ahead.len() >= AHEAD_SLOTS {
            ahead.remove(0).task.abort();
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let remote = self.remote.clone();
        let name = layout::container(id);
        let b = remote.inner.bucket.clone();
        let rt = remote.rt().handle().clone();
        let task = rt.spawn(async move {
            let at_most = seal::sealed_len_at_most(file_bytes);
            let res = b.get_at_most(&name, at_most).await.and_then(|body| {
                let header = Header::decode(&name, &body)?;
                let plain = seal::open(&remote.inner.key, &name, &body)?;
                Ok((header, plain))
            });
            let _ = tx.send(res.map_err(|e| b.in_bucket(e)));
        });
        ahead.push(Whole {
            id,
            askers: 1,
            asked: std::time::Instant::now(),
            rx,
            task,
        });
    }

    fn cancel_prefetch(&self, id: ContainerId) {
        let mut ahead = self.ahead.lock();
        if let Some(i) = ahead.iter().position(|w| w.id == id) {
            ahead[i].askers -= 1;
            if ahead[i].askers == 0 {
                ahead.remove(i).task.abort();
            }
        }
    }
}

/// The cold tier of a store whose remote could not be reached when it was opened: a container
/// evicted from local disk is then out of reach, and says so (not "missing").
struct Unreachable(String);

impl ColdTier for Unreachable {
    fn open(
        &self,
        id: ContainerId,
        _local: &std::path::Path,
    ) -> revault_engine::Result<Box<dyn ColdFile>> {
        Err(revault_engine::Error::RemoteUnavailable(format!(
            "container {id} is in the store's remote only, which could not be reached: {}",
            self.0
        )))
    }
}

/// Makes `store` answer reads of evicted containers with `remote_unavailable` and `why`.
pub fn serve_unreachable(store: &Store, why: String) {
    store.set_cold_tier(std::sync::Arc::new(Unreachable(why)));
}

/// An open container in the bucket.
struct RemoteContainer {
    remote: Remote,
    id: ContainerId,
    name: String,
    header: Header,
    stub: Stub,
    prefetched: Mutex<Vec<Prefetch>>,
}

/// The ends of a container's file: `[0, head.len())` and `[tail_start, len)`.
struct Stub {
    head: Vec<u8>,
    tail_start: u64,
    tail: Vec<u8>,
}

impl Stub {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16 + self.head.len() + self.tail.len());
        b.extend_from_slice(&(self.head.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.tail_start.to_le_bytes());
        b.extend_from_slice(&self.head);
        b.extend_from_slice(&self.tail);
        b
    }

    fn decode(b: &[u8], len: u64) -> Option<Stub> {
        let hl = usize::try_from(u64::from_le_bytes(b.get(..8)?.try_into().ok()?)).ok()?;
        let ts = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
        let head_end = hl.checked_add(16)?;
        let head = b.get(16..head_end)?.to_vec();
        let tail = b.get(head_end..)?.to_vec();
        (ts.checked_add(tail.len() as u64)? == len && head.len() as u64 <= ts).then_some(Stub {
            head,
            tail_start: ts,
            tail,
        })
    }
}

/// The fuzz target's way in: a stub decodes, or is refused, without panicking.
pub(crate) fn fuzz_stub(b: &[u8]) {
    let len = b.len() as u64;
    if let Some(s) = Stub::decode(b, len.saturating_sub(16)) {
        assert_eq!(s.tail_start + s.tail.len() as u64, len.saturating_sub(16));
        let again = Stub::decode(&s.encode(), len.saturating_sub(16)).expect("a stub re-encodes");
        assert_eq!(
            (again.head, again.tail_start, again.tail),
            (s.head, s.tail_start, s.tail)
        );
    }
}

struct Prefetch {
    range: Range<u64>,
    rx: Option<std::sync::mpsc::Receiver<Result<Vec<u8>>>>,
    data: Option<Vec<u8>>,
}

impl RemoteContainer {
    fn open(remote: &Remote, id: ContainerId) -> Result<RemoteContainer> {
        let name = layout::container(id);
        let header = match remote.inner.state.sealed_header(id)? {
            Some(h) if h.len() == seal::HEADER_LEN => Header::decode(&name, &h)?,
            _ => {
                let n = name.clone();
                let b = remote.run(move |b| async move {
                    b.get_range(&n, 0..seal::HEADER_LEN as u64).await
                })?;
                Header::decode(&name, &b).map_err(|e| remote.inner.bucket.in_bucket(e))?
            }
        };
        let mut c = RemoteContainer {
            remote: remote.clone(),
            id,
            name,
            header,
            stub: Stub {
                head: Vec::new(),
                tail_start: 0,
                tail: Vec::new(),
            },
            prefetched: Mutex::new(Vec::new()),
        };
        let len = c.header.plain_len;
        if let Some(s) = remote
            .inner
            .state
            .stub(id)?
            .and_then(|b| Stub::decode(&b, len))
        {
            c.stub = s;
            return Ok(c);
        }
        c.stub = c.read_stub()?;
        // A read-only store cannot record it; it is read again next time.
        let _ = remote.inner.state.set_stub(id, &c.stub.encode());
        Ok(c)
    }

    /// A container fetched whole ([`Tier::prefetch`]): its ends become its stub (recorded, as
    /// an opening records it), and its data the range a whole read asks for. `None` when the
    /// plaintext is too short to be a container (the regular opening then says so).
    fn from_whole(
        remote: &Remote,
        id: ContainerId,
        header: Header,
        mut plain: Vec<u8>,
    ) -> Option<RemoteContainer> {
        let len = plain.len() as u64;
        if len != header.plain_len || len < CONTAINER_HEADER + CONTAINER_TRAILER {
            return None;
        }
        let t = &plain[(len - CONTAINER_TRAILER) as usize..];
        let foff = u64::from_le_bytes(t[0..8].try_into().expect("8 bytes"));
        // The footer's offset, when the trailer names one inside the file; the engine
        // checks the footer itself (and refuses a wrong one) when it opens the container.
        let tail_start = if (CONTAINER_HEADER..=len - CONTAINER_TRAILER).contains(&foff) {
            foff
        } else {
            len - CONTAINER_TRAILER
        };
        let tail = plain.split_off(tail_start as usize);
        let data = plain.split_off(CONTAINER_HEADER as usize);
        let stub = Stub {
            head: plain,
            tail_start,
            tail,
        };
        // Recorded once (a synced write); a read-only store cannot record it at all.
        if !matches!(remote.inner.state.stub(id), Ok(Some(_))) {
            let _ = remote.inner.state.set_stub(id, &stub.encode());
        }
        Some(RemoteContainer {
            remote: remote.clone(),
            id,
            name: layout::container(id),
            header,
            stub,
            prefetched: Mutex::new(vec![Prefetch {
                range: CONTAINER_HEADER..tail_start,
                rx: None,
                data: Some(data),
            }]),
        })
    }

    /// Reads the container's header and its footer and trailer from the bucket.
    fn read_stub(&self) -> Result<Stub> {
        let len = self.header.plain_len;
        if len < CONTAINER_HEADER + CONTAINER_TRAILER {
            return Err(RemoteError::tampered(
                &self.name,
                "shorter than a container",
            ));
        }
        let head = self.fetch(0..CONTAINER_HEADER)?;
        // The last frame (or two) usually holds the whole footer; the trailer says.
        let guess = len
            .saturating_sub(self.header.frame_size())
            .max(CONTAINER_HEADER);
        let mut tail_start = guess;
        let mut tail = self.fetch(guess..len)?;
        let t = &tail[tail.len() - CONTAINER_TRAILER as usize..];
        let foff = u64::from_le_bytes(t[0..8].try_into().expect("8 bytes"));
        if foff < tail_start && foff >= CONTAINER_HEADER {
            let mut more = self.fetch(foff..tail_start)?;
            more.extend_from_slice(&tail);
            tail = more;
            tail_start = foff;
        }
        Ok(Stub {
            head,
            tail_start,
            tail,
        })
    }

    /// Plaintext bytes `range` of the container, from the bucket.
    fn fetch(&self, range: Range<u64>) -> Result<Vec<u8>> {
        let (plain_base, plain) =
            fetch_frames(&self.remote, &self.name, &self.header, range.clone())?;
        let off = (range.start - plain_base) as usize;
        Ok(plain[off..off + (range.end - range.start) as usize].to_vec())
    }

    /// The bytes of `range` if a prefetch holds them. A prefetch that failed gives nothing: the
    /// read fetches again, and reports the error as what it is (corrupt, missing, unreachable).
    fn take_prefetched(&self, range: &Range<u64>) -> Option<Vec<u8>> {
        let mut slots = self.prefetched.lock();
        let i = slots
            .iter()
            .position(|p| p.range.start <= range.start && range.end <= p.range.end)?;
        let p = &mut slots[i];
        if let Some(rx) = p.rx.take() {
            p.data = rx.recv().ok().and_then(|r| r.ok());
        }
        if p.range == *range {
            // Read whole, as read ahead: the bytes move out, uncopied.
            return slots.remove(i).data;
        }
        let base = p.range.start;
        let out = p
            .data
            .as_ref()
            .map(|d| d[(range.start - base) as usize..(range.end - base) as usize].to_vec());
        // A window reads its range once: free the memory (and a failed prefetch).
        if out.is_none() || range.end >= p.range.end {
            slots.remove(i);
        }
        out
    }
}

/// Fetches and opens the sealed frames holding plaintext `range` of object `name`:
/// (plaintext offset of the first frame, the frames' plaintext).
fn fetch_frames(
    remote: &Remote,
    name: &str,
    header: &Header,
    range: Range<u64>,
) -> Result<(u64, Vec<u8>)> {
    let (sealed, base) = header.sealed_range(&range);
    let n = name.to_string();
    let body = remote.run(move |b| async move { b.get_range(&n, sealed).await })?;
    let plain = seal::open_frames(
        &remote.inner.key,
        name,
        header,
        base / header.frame_size(),
        &body,
    )
    .map_err(|e| remote.inner.bucket.in_bucket(e))?;
    Ok((base, plain))
}

impl ColdFile for RemoteContainer {
    fn file_len(&self) -> u64 {
        self.header.plain_len
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> revault_engine::Result<()> {
        let end = offset + buf.len() as u64;
        let s = &self.stub;
        if end <= s.head.len() as u64 {
            buf.copy_from_slice(&s.head[offset as usize..end as usize]);
            return Ok(());
        }
        if offset >= s.tail_start && end <= s.tail_start + s.tail.len() as u64 {
            let o = (offset - s.tail_start) as usize;
            buf.copy_from_slice(&s.tail[o..o + buf.len()]);
            return Ok(());
        }
        let bytes = match self.take_prefetched(&(offset..end)) {
            Some(b) => b,
            None => self
                .fetch(offset..end)
                .map_err(|e| e.into_engine(&self.id.to_string()))?,
        };
        buf.copy_from_slice(&bytes);
        Ok(())
    }

    fn prefetch(&self, range: Range<u64>) {
        let mut slots = self.prefetched.lock();
        if slots.iter().any(|p| p.range == range) {
            return;
        }
        if slots.len() >= PREFETCH_SLOTS {
            slots.remove(0);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (remote, name, header, r) = (
            self.remote.clone(),
            self.name.clone(),
            self.header.clone(),
            range.clone(),
        );
        let b = remote.inner.bucket.clone();
        let rt = remote.rt().handle().clone();
        rt.spawn(async move {
            let (sealed, base) = header.sealed_range(&r);
            let res = match b.get_range(&name, sealed).await {
                Ok(body) => seal::open_frames(
                    &remote.inner.key,
                    &name,
                    &header,
                    base / header.frame_size(),
                    &body,
                )
                .map(|plain| {
                    let off = (r.start - base) as usize;
                    plain[off..off + (r.end - r.start) as usize].to_vec()
                })
                .map_err(|e| b.in_bucket(e)),
                Err(e) => Err(e),
            };
            let _ = tx.send(res);
        });
        slots.push(Prefetch {
            range,
            rx: Some(rx),
            data: None,
        });
    }
}

/// `revault remote evict`: which containers may leave local disk.
#[derive(Clone, Debug)]
pub struct EvictOptions {
    /// Containers written more recently than this stay (a restore of the version that just
    /// left the live window is the likeliest).
    pub older_than: Duration,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictReport {
    pub evicted: u64,
    pub evicted_bytes: u64,
    /// Kept: read by a live version.
    pub live: u64,
    /// Kept: younger than `olderThan`.
    pub recent: u64,
    /// Kept: not in the bucket yet (the next sync uploads it).
    pub not_uploaded: u64,
    pub local_bytes_after: u64,
}

impl Remote {
    /// Evicts from local disk the containers that are in the bucket, that no live version
    /// reads and that are older than `opts.older_than`. Syncs first, so every candidate is
    /// uploaded; the stubs that let an evicted container open without a request are kept.
    pub fn evict(&self, store: &Store, opts: &EvictOptions) -> Result<EvictReport> {
        self.sync(store)?;
        // A store another took over keeps its local copies: its bucket objects are the new
        // owner's to keep or delete now.
        self.check_fence()?;
        let live = live_containers(store)?;
        let uploaded = self.inner.state.uploaded()?;
        let mut rep = EvictReport::default();
        let now = SystemTime::now();
        let by_id: std::collections::HashSet<ContainerId> =
            uploaded.iter().map(|(id, _)| *id).collect();
        for (id, _) in &uploaded {
            let path = id.path(store.data_dir());
            let Ok(md) = std::fs::metadata(&path) else {
                continue;
            };
            if live.contains(id) {
                rep.live += 1;
                rep.local_bytes_after += md.len();
                continue;
            }
            let age = md
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .unwrap_or_default();
            if age < opts.older_than {
                rep.recent += 1;
                rep.local_bytes_after += md.len();
                continue;
            }
            self.keep_stub(store, *id)?;
            if store.evict_container(*id)? {
                rep.evicted += 1;
                rep.evicted_bytes += md.len();
            }
        }
        rep.not_uploaded = count_local_not_in(store, &by_id);
        Ok(rep)
    }

    /// Records container `id`'s ends from its local file, so it opens without a request.
    fn keep_stub(&self, store: &Store, id: ContainerId) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let path = id.path(store.data_dir());
        let f = std::fs::File::open(&path).map_err(|e| RemoteError::Io {
            context: format!("reading {}", path.display()),
            source: e,
        })?;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let read = |off: u64, n: u64| -> Result<Vec<u8>> {
            let mut b = vec![0u8; n as usize];
            f.read_exact_at(&mut b, off).map_err(|e| RemoteError::Io {
                context: format!("reading {}", path.display()),
                source: e,
            })?;
            Ok(b)
        };
        if len < CONTAINER_HEADER + CONTAINER_TRAILER {
            return Err(RemoteError::Engine(
                revault_engine::Error::CorruptContainer {
                    container: id.to_string(),
                    detail: "shorter than a container".into(),
                },
            ));
        }
        let trailer = read(len - CONTAINER_TRAILER, CONTAINER_TRAILER)?;
        let foff = u64::from_le_bytes(trailer[0..8].try_into().expect("8 bytes"))
            .clamp(CONTAINER_HEADER, len);
        let stub = Stub {
            head: read(0, CONTAINER_HEADER)?,
            tail_start: foff,
            tail: read(foff, len - foff)?,
        };
        self.inner.state.set_stub(id, &stub.encode())
    }
}

/// Container files in the data directory that are not in `uploaded`.
fn count_local_not_in(store: &Store, uploaded: &std::collections::HashSet<ContainerId>) -> u64 {
    let mut n = 0;
    let Ok(dirs) = std::fs::read_dir(store.data_dir()) else {
        return 0;
    };
    for d in dirs.flatten() {
        let Some(session) = u64::from_str_radix(&d.file_name().to_string_lossy(), 16).ok() else {
            continue;
        };
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            let Some(seq) = name
                .strip_suffix(".rvc")
                .and_then(|s| u64::from_str_radix(s, 16).ok())
            else {
                continue;
            };
            if !uploaded.contains(&ContainerId::new(session, seq)) {
                n += 1;
            }
        }
    }
    n
}
