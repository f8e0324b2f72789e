//! Bridges between async HTTP bodies and the synchronous engine, with
//! backpressure: a bounded channel of body frames feeds a `Read` for backups,
//! and a `Write` feeds a bounded channel that becomes the response body for
//! restores. Memory per stream is a few MiB whatever the stream's size.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::StreamExt;
use revault_engine::CancelledInput;
use tokio::sync::{mpsc, watch};

use super::limits::{self, BodyTimeout};
use super::metrics::Metrics;

/// Body frames queued between the network and the engine.
const BODY_QUEUE: usize = 16;
/// Response chunks queued between the engine and the network: at least
/// this many, and up to a restore's memory budget (see `ChannelWriter::new`).
const RESPONSE_QUEUE_MIN: usize = 8;
const RESPONSE_QUEUE_MAX: usize = 64;
const RESPONSE_CHUNK: usize = 1 << 20;
/// After the engine stopped reading (it failed early), read and discard at most
/// this much more of the body, while the error response goes out, so the
/// client reads the error rather than a reset connection (closing a socket
/// with unread data resets it, and a client still sending sees a broken pipe).
/// The answer goes out at once, and a client stops sending when it reads it,
/// so what arrives is mostly what was already in flight; the bounds are for
/// clients slow to read.
const DRAIN_BYTES: u64 = 64 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(30);

/// Why a body broke off when the server gave up on in-flight work.
const GAVE_UP: &str =
    "the server gave up on in-flight work (shutting down, or reopening its store)";

/// Why a restore's body broke off when the server gave up on it.
const CUT: &str = "the server gave up on this restore (shutting down, or reopening its store)";

enum Frame {
    Data(Bytes),
    /// The whole body arrived.
    End,
    /// The body broke off (client disconnect, truncated chunked encoding,
    /// fewer bytes than Content-Length).
    Failed(String),
}

/// Reads the request body on the async side and queues it for the engine.
pub struct BodyPump {
    /// Set when the body was cut for coming too slowly.
    timed_out: Arc<OnceLock<BodyTimeout>>,
}

impl BodyPump {
    /// Starts reading `body`; returns the pump and a reader for the engine.
    /// `expected` is the Content-Length, if any; `abort` changes when the
    /// server gives up on in-flight requests (the body then counts as cut).
    pub fn start(
        body: Body,
        expected: Option<u64>,
        mut abort: watch::Receiver<u64>,
        metrics: Arc<Metrics>,
    ) -> (BodyPump, BodyReader) {
        let started = *abort.borrow_and_update();
        let (tx, rx) = mpsc::channel::<Frame>(BODY_QUEUE);
        let timed_out = Arc::new(OnceLock::new());
        let cut = timed_out.clone();
        // Runs until the body ends, or (the engine gone) until the drain bounds: dropping the
        // pump does not stop it.
        tokio::spawn(async move {
            let mut s = body.into_data_stream();
            let mut got = 0u64;
            let mut drained = 0u64;
            // Set once the engine stopped reading: from then the body is drained until then.
            let mut drain_until: Option<tokio::time::Instant> = None;
            let drain_deadline = || Some(tokio::time::Instant::now() + DRAIN_TIME);
            loop {
                let item = tokio::select! {
                    item = s.next() => item,
                    _ = async { abort.wait_for(|g| *g != started).await.map(|_| ()) } => {
                        let _ = tx.send(Frame::Failed(GAVE_UP.into())).await;
                        return;
                    }
                    // The engine stopped reading (it failed): the drain clock starts now, not
                    // when the next chunk happens to arrive.
                    _ = tx.closed(), if drain_until.is_none() => {
                        drain_until = drain_deadline();
                        continue;
                    }
                    // The drain ends at its deadline even if the client sends nothing more.
                    _ = tokio::time::sleep_until(drain_until.unwrap_or_else(tokio::time::Instant::now)), if drain_until.is_some() => {
                        return;
                    }
                };
                match item {
                    Some(Ok(b)) => {
                        let n = b.len() as u64;
                        got += n;
                        metrics.bytes_in.inc_by(n);
                        if drain_until.is_none() && tx.send(Frame::Data(b)).await.is_err() {
                            drain_until = drain_deadline();
                        }
                        if drain_until.is_some() {
                            drained += n;
                            if drained > DRAIN_BYTES {
                                return;
                            }
                        }
                    }
                    Some(Err(e)) => {
                        if let Some(t) = limits::body_timeout(&e) {
                            let _ = cut.set(t.clone());
                        }
                        let _ = tx.send(Frame::Failed(e.to_string())).await;
                        return;
                    }
                    None => break,
                }
            }
            // A dropped connection can look like the end of the body: only a
            // body that is complete by every measure ends the stream.
            let aborted = *abort.borrow() != started;
            let frame = if aborted {
                Frame::Failed(GAVE_UP.into())
            } else if expected.is_some_and(|e| e != got) {
                Frame::Failed(format!(
                    "the body ended after {got} of {} bytes",
                    expected.unwrap_or(0)
                ))
            } else {
                Frame::End
            };
            let _ = tx.send(frame).await;
        });
        (
            BodyPump { timed_out },
            BodyReader {
                inner: Arc::new(Mutex::new(ReaderState {
                    rx,
                    cur: Bytes::new(),
                    ended: false,
                    touched: false,
                })),
            },
        )
    }

    /// Why the body was cut, if it came too slowly.
    pub fn timed_out(&self) -> Option<BodyTimeout> {
        self.timed_out.get().cloned()
    }
}

struct ReaderState {
    rx: mpsc::Receiver<Frame>,
    cur: Bytes,
    ended: bool,
    touched: bool,
}

/// The engine's view of a request body. Clones share one stream (a backup
/// retried after the series was briefly busy reads from where it stood).
/// A body that breaks off yields an error wrapping [`CancelledInput`], so the
/// engine discards the backup as cancelled rather than committing a prefix.
#[derive(Clone)]
pub struct BodyReader {
    inner: Arc<Mutex<ReaderState>>,
}

impl BodyReader {
    /// True once the reader has consumed anything (a retry is then unsafe).
    pub fn started(&self) -> bool {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).touched
    }
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if !s.cur.is_empty() {
                let n = s.cur.len().min(buf.len());
                buf[..n].copy_from_slice(&s.cur[..n]);
                s.cur.advance(n);
                return Ok(n);
            }
            if s.ended || buf.is_empty() {
                return Ok(0);
            }
            s.touched = true;
            match s.rx.blocking_recv() {
                Some(Frame::Data(b)) => s.cur = b,
                Some(Frame::End) => s.ended = true,
                Some(Frame::Failed(why)) => {
                    tracing::info!(error = %why, "request body broke off");
                    return Err(io::Error::other(CancelledInput));
                }
                // The pump went away without seeing the end: treat as cut short.
                None => return Err(io::Error::other(CancelledInput)),
            }
        }
    }
}

/// The engine's output for a restore: chunks go to the response body.
pub struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    buf: BytesMut,
    metrics: Arc<Metrics>,
    /// The server's give-up generation when the restore began (see `App::abort`).
    abort: watch::Receiver<u64>,
    started: u64,
    /// Set when the restore was cut: the body then ends in an error.
    cut: Arc<AtomicBool>,
    /// Set by [`ChannelWriter::complete`]; a writer dropped without it (the
    /// restore panicked) cuts the body, which must not look complete.
    completed: bool,
    rt: tokio::runtime::Handle,
}

impl ChannelWriter {
    /// A writer and the response body it feeds. A restore writes a whole
    /// assembly window at once; with room for about a window in the queue
    /// (`window_bytes`, capped at 64 MiB) it decodes the next window while
    /// the last one is sent, instead of waiting for the client (on the
    /// engine's one thread, decoding and sending were taking turns). The
    /// price: a restore holds up to twice its budget (docs/service.md).
    ///
    /// Made on the async side; written from the blocking pool. When `abort`
    /// changes (the server gives up on in-flight work) a write waiting for
    /// a client that does not read fails, so the restore lets go of the
    /// store, and the body ends in an error rather than looking complete.
    pub fn new(
        metrics: Arc<Metrics>,
        window_bytes: u64,
        mut abort: watch::Receiver<u64>,
    ) -> (ChannelWriter, Body) {
        let queue = ((window_bytes / RESPONSE_CHUNK as u64) as usize)
            .clamp(RESPONSE_QUEUE_MIN, RESPONSE_QUEUE_MAX);
        let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(queue);
        let cut = Arc::new(AtomicBool::new(false));
        let cut_seen = cut.clone();
        let stream = futures_util::stream::unfold(Some(rx), move |rx| {
            let cut = cut_seen.clone();
            async move {
                let mut rx = rx?;
                match rx.recv().await {
                    Some(item) => Some((item, Some(rx))),
                    None if cut.load(Ordering::SeqCst) => Some((Err(io::Error::other(CUT)), None)),
                    None => None,
                }
            }
        });
        let started = *abort.borrow_and_update();
        (
            ChannelWriter {
                tx,
                buf: BytesMut::with_capacity(RESPONSE_CHUNK),
                metrics,
                abort,
                started,
                cut,
                completed: false,
                rt: tokio::runtime::Handle::current(),
            },
            Body::from_stream(stream),
        )
    }

    fn ship(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        let n = chunk.len() as u64;
        let (tx, abort, started) = (&self.tx, &mut self.abort, self.started);
        let sent = self.rt.block_on(async move {
            tokio::select! {
                r = tx.send(Ok(chunk)) => r.map_err(|_| {
                    io::Error::new(io::ErrorKind::BrokenPipe, "the client went away")
                }),
                _ = abort.wait_for(|g| *g != started) => Err(io::Error::other(CUT)),
            }
        });
        if sent.is_err() {
            self.cut.store(true, Ordering::SeqCst);
        }
        sent?;
        self.metrics.bytes_out.inc_by(n);
        self.buf.reserve(RESPONSE_CHUNK);
        Ok(())
    }

    /// Sends what is buffered; the body then ends as complete.
    pub fn complete(&mut self) -> io::Result<()> {
        self.ship()?;
        self.completed = true;
        Ok(())
    }

    /// Ends the body with an error: the client sees a broken response rather
    /// than a short one that looks complete.
    pub fn fail(mut self, why: String) {
        if self.cut.load(Ordering::SeqCst) {
            return; // the body ends in an error already
        }
        self.completed = true; // the error below ends it
        let (tx, abort, started) = (&self.tx, &mut self.abort, self.started);
        let cut = self.rt.block_on(async move {
            tokio::select! {
                _ = tx.send(Err(io::Error::other(why))) => false,
                _ = abort.wait_for(|g| *g != started) => true,
            }
        });
        self.cut.store(cut, Ordering::SeqCst);
    }
}

impl Drop for ChannelWriter {
    fn drop(&mut self) {
        if !self.completed {
            // Before `tx` drops: the stream sees the flag once the queue ends.
            self.cut.store(true, Ordering::SeqCst);
        }
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut rest = data;
        while !rest.is_empty() {
            let room = RESPONSE_CHUNK - self.buf.len();
            let n = room.min(rest.len());
            self.buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if self.buf.len() >= RESPONSE_CHUNK {
                self.ship()?;
            }
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.ship()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body a restore's writer feeds: its bytes, or the error it ended in.
    async fn body_of(feed: impl FnOnce(ChannelWriter) + Send + 'static) -> Result<Vec<u8>, String> {
        let (_abort_tx, abort) = watch::channel(0u64);
        let (w, body) = ChannelWriter::new(Arc::new(Metrics::new()), 1 << 20, abort);
        tokio::task::spawn_blocking(move || feed(w));
        axum::body::to_bytes(body, usize::MAX)
            .await
            .map(|b| b.to_vec())
            .map_err(|e| e.to_string())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restore_that_stops_without_completing_ends_its_body_in_an_error() {
        let ok = body_of(|mut w| {
            w.write_all(b"all of it").unwrap();
            w.complete().unwrap();
        })
        .await;
        assert_eq!(ok.unwrap(), b"all of it");
        // A panic part-way drops the writer: the client must not get a short
        // body that looks complete.
        let cut = body_of(|mut w| {
            w.write_all(&[7u8; 3 << 20]).unwrap();
            drop(w);
        })
        .await;
        assert!(cut.is_err(), "a dropped writer's body ended cleanly");
        let failed = body_of(|mut w| {
            w.write_all(b"part").unwrap();
            w.fail("the disk said no".into());
        })
        .await;
        assert!(failed.unwrap_err().contains("the disk said no"));
    }
}
