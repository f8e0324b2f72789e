//! The backup's first three stages, each on its own thread: read the source into blocks,
//! cut the blocks into chunks (following the previous version's boundaries where it can,
//! see `predict`), fingerprint the chunks. Bounded channels join them, so memory stays
//! bounded whatever the input size.

use std::thread::JoinHandle;

use crate::ingest::{Target, BUF_BYTES};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;

use crate::bufpool::{BufPool, Lent};
use crate::error::{Error, Result};
use crate::format::fp::Fp;
use crate::ingest::chunker::Chunker;
use crate::ingest::predict::{fingerprint, Cuts, Cutter, Known, Loader, Window};
use crate::source::Source;
use crate::store::{Store, UnitCopy};
/// Source bytes at `data[head..end]` (see [`read_stage`]).
pub(super) struct Block {
    pub(super) data: Vec<u8>,
    pub(super) end: usize,
    /// Where pieces end (the next begins) in `data`, in order; the bytes after
    /// the last of them continue in the next block.
    pub(super) piece_ends: Vec<usize>,
}

pub(super) struct Batch {
    /// The block, shared by the chunks cut from it; when the last of them is
    /// done with it, it goes back to the reading stage to be filled again.
    pub(super) buf: Arc<Lent>,
    pub(super) chunks: Vec<(u32, u32)>,
    /// Fingerprints the chunking stage already computed (predictions, probes).
    pub(super) known: Vec<Known>,
}

pub(super) struct Hashed {
    pub(super) buf: Arc<Lent>,
    pub(super) chunks: Vec<(u32, u32)>,
    pub(super) fps: Vec<Fp>,
    pub(super) zero: Vec<bool>,
    /// Copies the previous version references (chunk mode, see predict).
    pub(super) copies: Vec<Option<UnitCopy>>,
    /// Bytes of this batch whose chunk boundaries were predicted.
    pub(super) predicted: u64,
}

/// Reads the source into blocks of [`BUF_BYTES`], leaving `head` bytes free
/// at the front of each for the uncut end of the block before (see
/// [`chunk_stage`]). Runs on its own thread so that reading (a copy out of
/// the page cache, a third of the chunking thread's time when it read for
/// itself) overlaps the cutting.
pub(super) fn read_stage(
    mut src: Box<dyn Source>,
    tx: Sender<Block>,
    pool: BufPool,
    head: usize,
    cancel: Arc<AtomicBool>,
) -> Result<Box<dyn Source>> {
    let mut in_piece = false;
    let mut more = true;
    while more {
        let mut data = pool.take().unwrap_or_else(|| vec![0u8; head + BUF_BYTES]);
        let mut end = head;
        let mut piece_ends = Vec::new();
        while end < data.len() {
            if cancel.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
            if !in_piece {
                if !src.next_piece()? {
                    more = false;
                    break;
                }
                in_piece = true;
            }
            let n = src.read(&mut data[end..])?;
            if n == 0 {
                piece_ends.push(end);
                in_piece = false;
            } else {
                end += n;
            }
        }
        if end > head || !piece_ends.is_empty() {
            let block = Block {
                data,
                end,
                piece_ends,
            };
            // The receiver is gone only when a later stage failed; it reports why.
            tx.send(block).map_err(|_| Error::Cancelled)?;
        }
    }
    Ok(src)
}

/// Cuts each block into chunks and ships it with them. The bytes after a
/// block's last cut (less than a maximum chunk: a chunk that may continue in
/// the next block) are copied into the next block's free front, and its
/// chunks are cut from there.
pub(super) fn chunk_stage(
    rx: Receiver<Block>,
    mut cutter: Cutter,
    tx: Sender<Batch>,
    pool: BufPool,
    head: usize,
    cancel: Arc<AtomicBool>,
) -> Result<()> {
    // The uncut end of the last block: bytes [from, to) of a shipped buffer.
    let mut carry: Option<(Arc<Lent>, usize, usize)> = None;
    for mut b in rx.iter() {
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        let mut start = head;
        if let Some((prev, from, to)) = carry.take() {
            start -= to - from;
            b.data[start..head].copy_from_slice(&prev[from..to]);
        }
        let mut cuts = Cuts::default();
        for &e in &b.piece_ends {
            start = cutter.cut_span(&b.data[..e], start, true, &mut cuts);
        }
        start = cutter.cut_span(&b.data[..b.end], start, false, &mut cuts);
        let buf = Arc::new(pool.lend(b.data));
        if start < b.end {
            carry = Some((buf.clone(), start, b.end));
        }
        if !cuts.chunks.is_empty() {
            let batch = Batch {
                buf,
                chunks: cuts.chunks,
                known: cuts.known,
            };
            // The receiver is gone only when the dedup stage failed; it reports why.
            tx.send(batch).map_err(|_| Error::Cancelled)?;
        }
    }
    // Every piece ends with a cut, so nothing is left over, unless reading
    // failed (then the backup reports that and commits nothing).
    Ok(())
}

pub(super) fn hash_stage(rx: Receiver<Batch>, tx: Sender<Hashed>, max_len: usize, zero_fp_max: Fp) {
    for b in rx.iter() {
        let (fps, zero): (Vec<Fp>, Vec<bool>) = b
            .chunks
            .par_iter()
            .zip(&b.known)
            .with_min_len(16)
            .map(|(&(s, l), k)| match *k {
                Known::Predicted(fp, z, _) | Known::Probed(fp, z, _) => (fp, z),
                Known::No => {
                    fingerprint(&b.buf[s as usize..(s + l) as usize], max_len, &zero_fp_max)
                }
            })
            .unzip();
        let predicted = b
            .chunks
            .iter()
            .zip(&b.known)
            .filter(|(_, k)| matches!(k, Known::Predicted(..)))
            .map(|(c, _)| u64::from(c.1))
            .sum();
        let copies = b.known.iter().map(Known::copy).collect();
        if tx
            .send(Hashed {
                buf: b.buf,
                chunks: b.chunks,
                fps,
                zero,
                copies,
                predicted,
            })
            .is_err()
        {
            return;
        }
    }
}

/// The three threads of a running backup and the channel the dedup stage reads from.
pub(super) struct Stages {
    pub(super) hashed: Receiver<Hashed>,
    pub(super) read: JoinHandle<Result<Box<dyn Source>>>,
    pub(super) chunk: JoinHandle<Result<()>>,
    pub(super) hash: JoinHandle<()>,
}

impl Stages {
    /// Starts reading, chunking and hashing `source`, and returns them with the loader of
    /// the previous version's chunk list (predictions), which the caller runs.
    pub(super) fn start(
        store: &Store,
        target: &Target,
        source: Box<dyn Source>,
        cancel: &Arc<AtomicBool>,
    ) -> (Stages, Option<Loader>) {
        // Stage 1 and 2 threads. Reading starts first, while the previous
        // version's chunk list is being loaded.
        let (block_tx, block_rx) = bounded::<Block>(2);
        let (batch_tx, batch_rx) = bounded::<Batch>(2);
        let (hashed_tx, hashed_rx) = bounded::<Hashed>(2);
        let pool = BufPool::new(8);
        let cfg = store.config();
        let chunker = Chunker::new(cfg.chunk);
        let max_len = cfg.chunk.max as usize;
        let read_cancel = cancel.clone();
        let read_thread = std::thread::Builder::new()
            .name("revault-read".into())
            .spawn({
                let pool = pool.clone();
                move || read_stage(source, block_tx, pool, max_len, read_cancel)
            })
            .expect("spawn reader");
        let chunk_cancel = cancel.clone();
        let zero_fp_max = Fp::of(&vec![0u8; max_len]);
        // Boundaries are predicted from the series' latest version (see predict),
        // whose chunk list a loader thread reads meanwhile.
        let (loader, old_chunks) = target
            .existing
            .as_ref()
            .zip(target.latest.as_ref())
            .and_then(|(s, v)| Loader::new(&store.meta, s, v, max_len, zero_fp_max))
            .unzip();
        let window = Window::new(old_chunks, chunker.most_chunks(BUF_BYTES));
        let chunk_thread = std::thread::Builder::new()
            .name("revault-chunk".into())
            .spawn(move || {
                chunk_stage(
                    block_rx,
                    Cutter::new(chunker, window, zero_fp_max),
                    batch_tx,
                    pool,
                    max_len,
                    chunk_cancel,
                )
            })
            .expect("spawn chunker");
        let hash_thread = std::thread::Builder::new()
            .name("revault-hash".into())
            .spawn(move || hash_stage(batch_rx, hashed_tx, max_len, zero_fp_max))
            .expect("spawn hasher");
        let stages = Stages {
            hashed: hashed_rx,
            read: read_thread,
            chunk: chunk_thread,
            hash: hash_thread,
        };
        (stages, loader)
    }
}
