//! `revault push` and `revault pull`: what backup and restore jobs run
//! against a `revault serve`. Bodies stream in both directions (bounded
//! memory); a directory travels as a tar built or extracted on the fly.

pub mod mover;
pub mod pull;
pub mod push;

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::{Buf, Bytes};
use clap::Args;
use revault_engine::BufPool;
use tokio::sync::mpsc;

/// An error the server answered with (`{code, message}`).
#[derive(Debug)]
pub struct RemoteError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (server said {} {})",
            self.message, self.status, self.code
        )
    }
}

impl std::error::Error for RemoteError {}

#[derive(Args, Clone, Debug)]
pub struct ServerArgs {
    /// Worker URL, e.g. http://revault-0.revault:8420 or https://...
    #[arg(long, env = "REVAULT_SERVER")]
    pub server: String,
    /// File holding the bearer token (its first non-comment line's first
    /// word). Default: the REVAULT_TOKEN environment variable.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Trust this CA certificate (PEM) for an https server.
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
    /// How long to wait for a worker that is starting (its store still opening, or not
    /// listening yet) before giving up, e.g. `2m`; `0` does not wait. A push also waits this
    /// long for a backup of its series that is running, and gives up on a worker that has
    /// neither read its upload nor answered for this long (a minute at least).
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub wait_ready: Duration,
}

pub fn read_token(file: Option<&Path>) -> Result<Option<String>> {
    if let Some(f) = file {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read token file {}", f.display()))?;
        let tok = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .and_then(|l| l.split_whitespace().next())
            .map(str::to_string);
        return match tok {
            Some(t) => Ok(Some(t)),
            None => bail!("token file {} holds no token", f.display()),
        };
    }
    Ok(std::env::var("REVAULT_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty()))
}

pub struct Conn {
    pub client: reqwest::Client,
    pub base: String,
    pub token: Option<String>,
    pub wait_ready: Duration,
}

impl Conn {
    pub fn new(a: &ServerArgs) -> Result<Conn> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            // No TCP user timeout (reqwest sets 30 s): a push waiting for a backup slot sends
            // into a zero window for as long as its turn takes (the worker reads nothing of a
            // queued body), and with a user timeout the client's own kernel aborts it after
            // 30 s ("Connection timed out") while the worker still holds the series for it.
            // A worker that vanishes is still noticed: by TCP keepalive while the connection
            // is idle, by the kernel's retransmission limit while data is unacknowledged, and
            // while an upload waits in the queue by asking it on another connection
            // (`Conn::send_watched`).
            .tcp_user_timeout(None)
            .tcp_nodelay(true)
            .user_agent(concat!("revault/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &a.ca_cert {
            let pem = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
            for c in reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("{}: not a PEM certificate", ca.display()))?
            {
                b = b.add_root_certificate(c);
            }
        }
        let base = a.server.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("--server {base:?}: expected http://HOST:PORT or https://HOST:PORT");
        }
        Ok(Conn {
            client: b.build().context("setting up the HTTP client")?,
            base,
            token: read_token(a.token_file.as_deref())?,
            wait_ready: a.wait_ready,
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.client.request(method, self.url(path));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Waits, with backoff, while the worker is starting or being replaced: not listening
    /// (connection refused), answering 503 `starting` while its store opens, or 503
    /// `shutting_down` on its way down (a worker pod's Service routes to it until it is
    /// gone, and its replacement follows). A body cannot be sent twice (stdin is read once),
    /// so a push asks before it sends: the worker it would reach refuses the body unread,
    /// and the client saw only "Broken pipe". Work that writes (`writes`) also waits while
    /// the store is degraded by a full disk (503 `unavailable`: it recovers once room is
    /// freed), and any other refusal is returned as the server said it; reads go ahead, as
    /// they are still served.
    pub async fn wait_until_ready(&self, writes: bool, quiet: bool) -> Result<()> {
        let deadline = tokio::time::Instant::now() + self.wait_ready;
        let mut backoff = Duration::from_millis(200);
        let mut said = String::new();
        loop {
            let now = tokio::time::Instant::now();
            // A server (or proxy) that takes the connection and never answers must not hold
            // the client past its deadline.
            let probe = (deadline - now).clamp(Duration::from_secs(1), Duration::from_secs(10));
            let sent = self
                .client
                .get(self.url("/readyz"))
                .timeout(probe)
                .send()
                .await;
            let why = match sent {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => match check(r).await.map_err(|e| e.downcast::<RemoteError>()) {
                    Err(Ok(re)) if re.code == "starting" || re.code == "shutting_down" => {
                        re.to_string()
                    }
                    // A store degraded by a full disk takes writes again by itself once room
                    // is freed: work that writes waits for that too (reads go ahead below).
                    Err(Ok(re)) if writes && re.code == "unavailable" => re.to_string(),
                    Err(Ok(re)) if writes => return Err(re.into()),
                    // A server without /readyz, or a refusal reads do not care about.
                    _ => return Ok(()),
                },
                Err(e) if refused(&e) => format!("cannot connect ({})", root_cause(&e)),
                Err(e) => {
                    return Err(anyhow::Error::new(e).context(format!("reaching {}", self.base)))
                }
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                bail!(
                    "the worker at {} is not ready after {} (--wait-ready): {why}",
                    self.base,
                    humantime::format_duration(self.wait_ready)
                );
            }
            if why != said && !quiet {
                eprintln!("waiting for the worker at {}: {why}", self.base);
            }
            said = why;
            tokio::time::sleep(backoff.min(deadline - now)).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

/// Bytes of an upload's body the connection has taken so far: the sign that a worker still
/// reads it (see [`Conn::send_watched`]).
#[derive(Clone, Default)]
pub struct Sent(Arc<AtomicU64>);

impl Sent {
    fn add(&self, n: usize) {
        self.0.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// `body` with every chunk it yields counted here.
    pub fn counting<S, E>(&self, body: S) -> impl futures_util::Stream<Item = Result<Bytes, E>>
    where
        S: futures_util::Stream<Item = Result<Bytes, E>>,
    {
        let counted = self.clone();
        futures_util::StreamExt::inspect(body, move |b| {
            if let Ok(b) = b {
                counted.add(b.len());
            }
        })
    }
}

/// The shortest silence after which [`Conn::send_watched`] gives up, whatever --wait-ready
/// says: a probe lost now and then (a SYN retransmitted after 1 s) is no sign of a lost worker.
const SILENCE_FLOOR: Duration = Duration::from_secs(60);

impl Conn {
    /// Sends an upload to the series at `path` whose body counts into `sent`, and gives up once
    /// the worker has neither taken a byte of the body nor answered `GET {path}/backup` (asked
    /// on another connection now and
    /// then; any HTTP answer counts) for --wait-ready, or a minute if that is longer. A worker
    /// that queues the upload for a backup slot reads nothing of it: the client sends into a
    /// zero window, which the kernel fails only after its window probes run out (half an hour
    /// or more) when the worker's node is lost, and never when the worker is stopped or cut off.
    /// A refused connection is no answer: a Service whose pod is gone refuses.
    pub async fn send_watched(
        &self,
        req: reqwest::RequestBuilder,
        path: &str,
        sent: &Sent,
    ) -> Result<reqwest::Response> {
        let progress = format!("{path}/backup");
        tokio::select! {
            r = req.send() => r.with_context(|| format!("uploading to {}", self.base)),
            why = self.watch(&progress, sent) => Err(why),
        }
    }

    async fn watch(&self, progress: &str, sent: &Sent) -> anyhow::Error {
        let silence = self.wait_ready.max(SILENCE_FLOOR);
        let every = (silence / 4).min(Duration::from_secs(30));
        let (mut heard, mut bytes) = (tokio::time::Instant::now(), sent.get());
        loop {
            tokio::time::sleep(every).await;
            let asked = self
                .req(reqwest::Method::GET, progress)
                .timeout(every.min(Duration::from_secs(10)))
                .send()
                .await;
            let now_bytes = sent.get();
            match asked {
                Err(e) if now_bytes == bytes && heard.elapsed() >= silence => {
                    return anyhow::Error::new(e).context(format!(
                        "the worker at {} has neither read the upload nor answered for {}: gave \
                         up on the upload (whether it created a version is unknown)",
                        self.base,
                        humantime::format_duration(silence)
                    ));
                }
                Err(_) if now_bytes == bytes => {}
                _ => (heard, bytes) = (tokio::time::Instant::now(), now_bytes),
            }
        }
    }
}

/// The connection was refused: nothing listens yet (a worker pod starting). A DNS, TLS or
/// certificate failure is not worth waiting for.
fn refused(e: &reqwest::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return io.kind() == io::ErrorKind::ConnectionRefused;
        }
        cur = err.source();
    }
    false
}

/// The innermost error's message ("Connection refused"), not reqwest's outer layers.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Turns a non-success response into a [`RemoteError`].
pub async fn check(resp: reqwest::Response) -> Result<reqwest::Response> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.bytes().await.unwrap_or_default();
    let (code, message) = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(v) => (
            v["code"].as_str().unwrap_or("error").to_string(),
            v["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned()),
        ),
        Err(_) => (
            "error".to_string(),
            format!("{status}: {}", String::from_utf8_lossy(&body).trim()),
        ),
    };
    Err(RemoteError {
        status: status.as_u16(),
        code,
        message,
    }
    .into())
}

pub fn series_path(series: &str) -> Result<String> {
    revault_engine::check_series_name(series)?;
    Ok(format!("/v1/series/{series}"))
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

pub const CHUNK: usize = 1 << 20;
pub const QUEUE: usize = 8;

/// A `Write` whose bytes become a request body (bounded queue).
pub struct ChannelWrite {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
    /// Chunks the HTTP stack is done with come back here to be filled again.
    pool: BufPool,
}

impl ChannelWrite {
    pub fn new(tx: mpsc::Sender<io::Result<Bytes>>) -> Self {
        ChannelWrite {
            tx,
            buf: Vec::with_capacity(CHUNK),
            pool: BufPool::new(QUEUE + 2),
        }
    }

    /// Reads from `r` straight into the chunk being filled (not through a
    /// separate read buffer, which cost a copy of every byte pushed) and
    /// ships the chunk when it is full. Returns the bytes read: 0 at the end.
    pub fn fill_from(&mut self, r: &mut impl Read) -> io::Result<usize> {
        let room = (CHUNK - self.buf.len()) as u64;
        let n = r.by_ref().take(room).read_to_end(&mut self.buf)?;
        if self.buf.len() >= CHUNK {
            self.ship()?;
        }
        Ok(n)
    }

    /// A chunk the HTTP stack is done with, emptied for filling.
    fn recycled(&self) -> Option<Vec<u8>> {
        self.pool.take().map(|mut v| {
            v.clear();
            v
        })
    }

    fn ship(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let next = self.recycled().unwrap_or_else(|| Vec::with_capacity(CHUNK));
        let b = Bytes::from_owner(self.pool.lend(std::mem::replace(&mut self.buf, next)));
        self.tx
            .blocking_send(Ok(b))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the upload stopped"))
    }
}

impl Write for ChannelWrite {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = (CHUNK - self.buf.len()).min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.ship()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.ship()
    }
}

/// A `Read` fed from a response body (bounded queue).
pub struct ChannelRead {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    cur: Bytes,
}

impl ChannelRead {
    pub fn new(rx: mpsc::Receiver<io::Result<Bytes>>) -> Self {
        ChannelRead {
            rx,
            cur: Bytes::new(),
        }
    }
}

impl Read for ChannelRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = self.cur.len().min(buf.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        self.cur.advance(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Yields its data in short, uneven reads, like a pipe.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.step = self.step % 7919 + 4099;
            let n = self.data.len().min(buf.len()).min(self.step);
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn fill_from_ships_whole_chunks_and_the_exact_bytes() {
        let data: Vec<u8> = (0..(2 * CHUNK + 12_345) as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        let (tx, mut rx) = mpsc::channel::<io::Result<Bytes>>(8);
        let mut w = ChannelWrite::new(tx);
        let mut r = Trickle {
            data: &data,
            step: 0,
        };
        let mut read = 0;
        loop {
            match w.fill_from(&mut r).unwrap() {
                0 => break,
                n => read += n,
            }
        }
        w.flush().unwrap();
        drop(w);
        let mut chunks = Vec::new();
        while let Ok(b) = rx.try_recv() {
            chunks.push(b.unwrap());
        }
        assert_eq!(read, data.len());
        let sizes: Vec<usize> = chunks.iter().map(|c| c.len()).collect();
        assert_eq!(sizes, vec![CHUNK, CHUNK, 12_345]);
        assert_eq!(chunks.concat(), data);
    }

    #[test]
    fn a_sent_chunk_is_filled_again() {
        let (tx, mut rx) = mpsc::channel::<io::Result<Bytes>>(8);
        let mut w = ChannelWrite::new(tx);
        w.write_all(&vec![1u8; CHUNK]).unwrap();
        let first = rx.try_recv().unwrap().unwrap();
        assert!(w.recycled().is_none(), "not back before it is sent");
        drop(first); // sent
        let back = w.recycled().expect("the sent chunk came back");
        assert!(back.is_empty() && back.capacity() >= CHUNK);
        // Back in the pool; chunks filled from recycled memory carry their own bytes.
        drop(w.pool.lend(back));
        w.write_all(&vec![2u8; 2 * CHUNK]).unwrap();
        let second = rx.try_recv().unwrap().unwrap();
        let third = rx.try_recv().unwrap().unwrap();
        assert!(second.iter().chain(third.iter()).all(|&b| b == 2));
        assert_eq!((second.len(), third.len()), (CHUNK, CHUNK));
    }
}
