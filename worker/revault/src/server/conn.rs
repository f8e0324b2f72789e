//! Connections: the accept loop with its caps, TLS handshakes, HTTP/1.1 with
//! a header-read timeout, a send timeout on every connection, and graceful
//! shutdown. Whatever clients do, descriptors stay bounded (a cap in all, a
//! cap per client address) and every connection either makes progress or
//! is closed. See "Limits" in docs/service.md.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio_rustls::TlsAcceptor;

use super::limits::{self, LimitArgs, WaitClock};
use super::metrics::Metrics;

/// How the server stands: serving, draining (no new connections; open ones
/// finish their request), or closed (open connections are dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Running,
    Draining,
    Closed,
}

/// Stops the server: see [`serve`].
#[derive(Clone)]
pub struct Shutdown {
    phase: Arc<watch::Sender<Phase>>,
    counter: Arc<ConnCounter>,
}

impl Shutdown {
    /// Stops accepting; open connections finish their current request.
    pub fn graceful(&self) {
        self.phase.send_if_modified(|p| {
            let change = *p == Phase::Running;
            if change {
                *p = Phase::Draining;
            }
            change
        });
    }

    /// Drops every open connection.
    pub fn close(&self) {
        self.phase.send_replace(Phase::Closed);
    }

    pub fn connection_count(&self) -> usize {
        self.counter.total()
    }
}

/// Everything a connection task needs.
struct Ctx {
    router: Router,
    http: http1::Builder,
    tls: Option<TlsAcceptor>,
    tls_timeout: Option<Duration>,
    send_timeout: Option<Duration>,
    keepalive: Option<Duration>,
    counter: Arc<ConnCounter>,
    metrics: Arc<Metrics>,
    rejections: LogEvery,
}

/// Serves `router` on `listener` until [`Shutdown`]; the task ends once the
/// listener is closed and every connection has ended.
pub fn serve(
    listener: std::net::TcpListener,
    router: Router,
    tls: Option<rustls::ServerConfig>,
    limits: &LimitArgs,
    caps: (usize, usize),
    metrics: Arc<Metrics>,
) -> io::Result<(tokio::task::JoinHandle<io::Result<()>>, Shutdown)> {
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let counter = Arc::new(ConnCounter::new(caps.0, caps.1, metrics.clone()));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits::enabled(limits.header_timeout))
        .max_header_size(limits::MAX_HEAD_BYTES)
        .max_headers(limits::MAX_HEADERS);
    let ctx = Arc::new(Ctx {
        router,
        http,
        tls: tls.map(|c| TlsAcceptor::from(Arc::new(c))),
        tls_timeout: limits::enabled(limits.tls_handshake_timeout),
        send_timeout: limits::enabled(limits.send_timeout),
        keepalive: limits::enabled(limits.tcp_keepalive),
        counter: counter.clone(),
        metrics,
        rejections: LogEvery::new(Duration::from_secs(10)),
    });
    let (phase, rx) = watch::channel(Phase::Running);
    let task = tokio::spawn(accept_loop(listener, ctx, rx));
    Ok((
        task,
        Shutdown {
            phase: Arc::new(phase),
            counter,
        },
    ))
}

async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<Ctx>,
    mut phase: watch::Receiver<Phase>,
) -> io::Result<()> {
    let errors = LogEvery::new(Duration::from_secs(10));
    loop {
        let accepted = tokio::select! {
            biased;
            _ = phase.wait_for(|p| *p != Phase::Running) => break,
            r = listener.accept() => r,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors (the caps should prevent it) or a
                // connection that died in the backlog: back off, go on.
                if errors.ready() {
                    tracing::warn!(error = %e, "accepting a connection failed");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match ctx.counter.acquire(peer.ip()) {
            Ok(slot) => {
                tokio::spawn(connection(ctx.clone(), tcp, slot, phase.clone()));
            }
            Err(reason) => {
                // Closed at once: the descriptor goes back right away.
                drop(tcp);
                ctx.metrics.reject(reason);
                if ctx.rejections.ready() {
                    tracing::warn!(client = %peer.ip(), reason, open = ctx.counter.total(), "connection cap reached: closing new connections (logged every 10 s at most)");
                }
            }
        }
    }
    // Refuse new connections at once rather than leave them in the backlog.
    drop(listener);
    ctx.counter.wait_empty().await;
    Ok(())
}

/// Turns TCP keepalive on (`--tcp-keepalive`: probes after `idle` without a
/// packet, then every third of it, failing after three unanswered). A client
/// whose host vanished (a backup pod's node lost, a pod whose kernel aborted
/// the connection and is gone) never sends a FIN or RST; without probes the
/// server would wait on its body for --body-idle-timeout, holding the series
/// and a backup slot, and the Job's next pod would be refused as busy. A live
/// client's kernel answers the probes however slowly its program sends.
fn keep_alive(tcp: &TcpStream, idle: Option<Duration>) {
    let Some(idle) = idle else { return };
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval((idle / 3).max(Duration::from_secs(1)))
        .with_retries(3);
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&ka) {
        tracing::warn!(error = %e, "cannot turn TCP keepalive on for a connection");
    }
}

/// Serves one connection to its end.
async fn connection(ctx: Arc<Ctx>, tcp: TcpStream, slot: Slot, mut phase: watch::Receiver<Phase>) {
    keep_alive(&tcp, ctx.keepalive);
    let state = Arc::new(ConnState::default());
    let io = ConnIo {
        _slot: slot,
        inner: tcp,
        send_timeout: ctx.send_timeout,
        stall: WaitClock::default(),
        state: state.clone(),
        metrics: ctx.metrics.clone(),
    };
    let svc = TowerToHyperService::new(ctx.router.clone());
    let r = match &ctx.tls {
        None => serve_http(&ctx.http, TokioIo::new(io), svc, &state, &mut phase).await,
        Some(acceptor) => {
            let handshake = acceptor.accept(io);
            let tls = match ctx.tls_timeout {
                Some(t) => match tokio::time::timeout(t, handshake).await {
                    Ok(r) => r,
                    Err(_) => {
                        ctx.metrics.timeout("tls_handshake");
                        return;
                    }
                },
                None => handshake.await,
            };
            match tls {
                Ok(s) => serve_http(&ctx.http, TokioIo::new(s), svc, &state, &mut phase).await,
                Err(e) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
            }
        }
    };
    match r {
        Ok(()) => {}
        // Counted where it fired.
        Err(_) if state.send_timed_out.load(Ordering::Relaxed) => {}
        // hyper's header-read timeout: a partial head, or nothing at all
        // since the connection opened or its last response.
        Err(e) if e.is_timeout() => {
            let kind = if state.read_since_write.load(Ordering::Relaxed) {
                "header"
            } else {
                "idle"
            };
            ctx.metrics.timeout(kind);
        }
        Err(e) => tracing::debug!(error = %e, "connection ended with an error"),
    }
}

async fn serve_http<I>(
    http: &http1::Builder,
    io: I,
    svc: TowerToHyperService<Router>,
    state: &ConnState,
    phase: &mut watch::Receiver<Phase>,
) -> Result<(), hyper::Error>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let conn = http.serve_connection(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => return r,
        _ = phase.wait_for(|p| *p != Phase::Running) => {}
    }
    // Draining: a connection that never sent a byte is closed now; others
    // finish the request they are on, without keep-alive.
    if !state.ever_read.load(Ordering::Relaxed) {
        return Ok(());
    }
    conn.as_mut().graceful_shutdown();
    tokio::select! {
        r = conn.as_mut() => r,
        _ = phase.wait_for(|p| *p == Phase::Closed) => Ok(()),
    }
}

// ---- counting connections ------------------------------------------------------

/// Open connections, in all and per client address.
struct ConnCounter {
    max: usize,
    per_client: usize,
    open: Mutex<Open>,
    empty: Notify,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

/// One open connection's place in the counts, given back when dropped.
struct Slot {
    counter: Arc<ConnCounter>,
    client: IpAddr,
}

impl ConnCounter {
    fn new(max: usize, per_client: usize, metrics: Arc<Metrics>) -> ConnCounter {
        ConnCounter {
            max,
            per_client,
            open: Mutex::new(Open::default()),
            empty: Notify::new(),
            metrics,
        }
    }

    fn total(&self) -> usize {
        self.open.lock().unwrap().total
    }

    /// A slot for a new connection from `client`, or the cap it would break
    /// (the label of `revault_rejected_connections_total`).
    fn acquire(self: &Arc<Self>, client: IpAddr) -> Result<Slot, &'static str> {
        // An IPv4 client reaching an IPv6 socket is still the same client.
        let client = client.to_canonical();
        let mut open = self.open.lock().unwrap();
        let mine = open.by_client.get(&client).copied().unwrap_or(0);
        if mine >= self.per_client {
            return Err("max_connections_per_client");
        }
        if open.total >= self.max {
            return Err("max_connections");
        }
        open.total += 1;
        open.by_client.insert(client, mine + 1);
        self.metrics.open_connections.inc();
        Ok(Slot {
            counter: self.clone(),
            client,
        })
    }

    async fn wait_empty(&self) {
        loop {
            let notified = self.empty.notified();
            if self.total() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let c = &self.counter;
        let mut open = c.open.lock().unwrap();
        open.total -= 1;
        if let Some(n) = open.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                open.by_client.remove(&self.client);
            }
        }
        c.metrics.open_connections.dec();
        if open.total == 0 {
            c.empty.notify_waiters();
        }
    }
}

// ---- the connection's socket -----------------------------------------------------

/// What a connection's socket saw, for the connection task to classify how
/// it ended.
#[derive(Default)]
struct ConnState {
    ever_read: AtomicBool,
    /// Bytes arrived since the last bytes went out (a request head begun).
    read_since_write: AtomicBool,
    send_timed_out: AtomicBool,
}

/// A client's TCP stream, holding its place in the connection counts, with
/// a send timeout: a write that cannot make progress for `send_timeout`
/// (the client stopped reading) fails, which ends the connection and drops
/// the response body (a restore then ends: its output has nowhere to go).
struct ConnIo {
    _slot: Slot,
    inner: TcpStream,
    send_timeout: Option<Duration>,
    /// How long writes have been unable to proceed.
    stall: WaitClock,
    state: Arc<ConnState>,
    metrics: Arc<Metrics>,
}

impl ConnIo {
    /// After a write that returned `Pending`: fails once writes have been
    /// stuck for the send timeout.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let Some(limit) = self.send_timeout else {
            return Poll::Pending;
        };
        if self.stall.poll_wait(cx, limit).is_pending() {
            return Poll::Pending;
        }
        if !self.state.send_timed_out.swap(true, Ordering::Relaxed) {
            self.metrics.timeout("send");
            tracing::info!(timeout = ?limit, "the client stopped reading: closing the connection");
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client accepted no data within the send timeout",
        )))
    }

    /// Notes the outcome of a write, flush or shutdown that did not return
    /// `Pending`; `sent` is whether bytes went out.
    fn done<T>(&mut self, r: io::Result<T>, sent: bool) -> Poll<io::Result<T>> {
        self.stall.stop();
        if sent {
            self.state.read_since_write.store(false, Ordering::Relaxed);
        }
        Poll::Ready(r)
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.ever_read.store(true, Ordering::Relaxed);
            this.state.read_since_write.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                let sent = matches!(r, Ok(n) if n > 0);
                this.done(r, sent)
            }
            Poll::Pending => this.stalled(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => {
                let sent = matches!(r, Ok(n) if n > 0);
                this.done(r, sent)
            }
            Poll::Pending => this.stalled(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Ready(r) => this.done(r, false),
            Poll::Pending => this.stalled(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Ready(r) => this.done(r, false),
            Poll::Pending => this.stalled(cx),
        }
    }
}

/// Lets a log line through at most once per period (a flood would
/// otherwise write one per connection).
struct LogEvery {
    period_ms: i64,
    last_ms: AtomicI64,
}

impl LogEvery {
    fn new(period: Duration) -> LogEvery {
        LogEvery {
            period_ms: period.as_millis() as i64,
            last_ms: AtomicI64::new(i64::MIN / 2),
        }
    }

    fn ready(&self) -> bool {
        let now = now_ms();
        let last = self.last_ms.load(Ordering::Relaxed);
        now - last >= self.period_ms
            && self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

fn now_ms() -> i64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as i64
}
