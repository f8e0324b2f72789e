//! What the server grants one client: the limit flags of `revault serve`, the
//! open-file limit they live within, and the pacing of request bodies (a body
//! that stops or trickles is cut). Connections and their caps and timeouts
//! are in [`super::conn`]; see "Limits" in docs/service.md.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::Router;
use clap::Args;
use http_body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::metrics::Metrics;
use super::parse_duration;

/// Request heads (request line and headers) larger than this get 431.
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// Request heads with more headers than this get 431 (hyper's default).
pub const MAX_HEADERS: usize = 100;

/// The limit flags of `revault serve` (`0` disables a timeout or the rate).
#[derive(Args, Clone, Debug)]
pub struct LimitArgs {
    /// A connection must send a whole request head within this long of
    /// opening, and of the end of its previous response (so it also bounds
    /// keep-alive idle time); otherwise it is closed.
    #[arg(long, env = "REVAULT_HEADER_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub header_timeout: Duration,
    /// With --tls-cert: a TLS handshake must finish within this long.
    #[arg(long, env = "REVAULT_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub tls_handshake_timeout: Duration,
    /// Open connections in all; beyond it new ones are closed at once. At
    /// most half the open-file limit (the rest stays for the store's files).
    #[arg(long, env = "REVAULT_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Open connections from one client address; beyond it that address's
    /// new connections are closed at once.
    #[arg(
        long,
        env = "REVAULT_MAX_CONNECTIONS_PER_CLIENT",
        default_value_t = 256
    )]
    pub max_connections_per_client: usize,
    /// An upload or JSON body that delivers no byte for this long is cut
    /// (408; an upload's backup is discarded).
    #[arg(long, env = "REVAULT_BODY_IDLE_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub body_idle_timeout: Duration,
    /// A body must arrive at this many bytes per second at least, averaged
    /// over each --body-rate-window the server spends waiting for it.
    #[arg(long, env = "REVAULT_BODY_MIN_RATE", default_value_t = 500)]
    pub body_min_rate: u64,
    /// The window of --body-min-rate.
    #[arg(long, env = "REVAULT_BODY_RATE_WINDOW", default_value = "5m", value_parser = parse_duration)]
    pub body_rate_window: Duration,
    /// A response (a restore, say) whose client accepts no byte for this
    /// long is aborted, and the work behind it ends.
    #[arg(long, env = "REVAULT_SEND_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub send_timeout: Duration,
    /// TCP keepalive of every connection: probes start after this long
    /// without a packet from the client, then every third of it, and the
    /// connection fails after three unanswered (so a client whose host
    /// vanished is dropped after twice this, its backup with it).
    #[arg(long, env = "REVAULT_TCP_KEEPALIVE", default_value = "30s", value_parser = parse_duration)]
    pub tcp_keepalive: Duration,
    /// Backups run at once; more wait their turn, first come first served,
    /// reading nothing of their bodies meanwhile (0: no limit).
    #[arg(long, env = "REVAULT_MAX_BACKUPS", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(0..=10_000))]
    pub max_backups: u16,
}

/// `Some(d)` unless `d` is zero ("disabled").
pub fn enabled(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// Raises the soft open-file limit to the hard one (connections and the
/// store's files share it) and returns the soft limit in force.
pub fn raise_open_files() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    // An unlimited hard limit still stops at the kernel's nr_open.
    let hard = if lim.rlim_max == libc::RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20)
    } else {
        lim.rlim_max
    };
    if lim.rlim_cur < hard {
        let raised = libc::rlimit {
            rlim_cur: hard,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return hard;
        }
        tracing::warn!(
            soft = lim.rlim_cur,
            hard,
            "cannot raise the open-file limit"
        );
    }
    lim.rlim_cur
}

/// The connection caps in force: (in all, per client address). Half the
/// open-file limit stays for the store (RocksDB keeps its tables open,
/// restores open containers), whatever was asked for.
pub fn connection_caps(a: &LimitArgs, open_files: u64) -> (usize, usize) {
    let by_files = usize::try_from(open_files / 2).unwrap_or(usize::MAX);
    let max = a.max_connections.min(by_files).max(1);
    (max, a.max_connections_per_client.clamp(1, max))
}

// ---- waits ----------------------------------------------------------------------------

/// Measures how long something has been waiting (for a client's bytes, for
/// a client to accept ours) and wakes the waiter once a wait has lasted a
/// limit. Waits are short and many on a busy connection, so the timer is
/// not re-armed for each: it is moved only when it would fire late, and a
/// timer that fires early is just looked at again.
#[derive(Default)]
pub struct WaitClock {
    since: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
}

impl WaitClock {
    /// Starts a wait, or goes on with the current one: ready with its
    /// length once it has lasted `limit` (the wait then goes on until
    /// [`WaitClock::stop`]).
    pub fn poll_wait(&mut self, cx: &mut Context<'_>, limit: Duration) -> Poll<Duration> {
        let mut now = Instant::now();
        let since = *self.since.get_or_insert(now);
        let due = since + limit;
        loop {
            if now >= due {
                return Poll::Ready(now - since);
            }
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            if timer.deadline() > due || timer.deadline() <= now {
                timer.as_mut().reset(due);
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            now = Instant::now();
        }
    }

    /// Ends the current wait (the awaited thing happened); returns its length.
    pub fn stop(&mut self) -> Duration {
        self.since.take().map_or(Duration::ZERO, |t| t.elapsed())
    }
}

// ---- request bodies ----------------------------------------------------------------

/// How a request body was cut for arriving too slowly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyTimeout {
    /// No byte for this long.
    Idle(Duration),
    /// Fewer than `min_rate` bytes per second over `window`.
    Rate { min_rate: u64, window: Duration },
}

impl BodyTimeout {
    /// The label of `revault_timeouts_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            BodyTimeout::Idle(_) => "body_idle",
            BodyTimeout::Rate { .. } => "body_rate",
        }
    }
}

impl fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyTimeout::Idle(d) => write!(
                f,
                "the request body sent nothing for {} (--body-idle-timeout)",
                humantime::format_duration(*d)
            ),
            BodyTimeout::Rate { min_rate, window } => write!(
                f,
                "the request body arrived slower than {min_rate} bytes/s over {} (--body-min-rate, --body-rate-window)",
                humantime::format_duration(*window)
            ),
        }
    }
}

impl StdError for BodyTimeout {}

/// The [`BodyTimeout`] behind a body error, if that is what it is (body
/// errors arrive wrapped by axum and hyper).
pub fn body_timeout<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a BodyTimeout> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<BodyTimeout>() {
            return Some(t);
        }
        cur = err.source();
    }
    None
}

/// The pace a request body must keep.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    idle: Option<Duration>,
    min_rate: u64,
    window: Option<Duration>,
}

impl Pace {
    pub fn new(a: &LimitArgs) -> Pace {
        Pace {
            idle: enabled(a.body_idle_timeout),
            min_rate: a.body_min_rate,
            window: enabled(a.body_rate_window).filter(|_| a.body_min_rate > 0),
        }
    }
}

/// Paces every request body of `router` (see [`PacedBody`]).
pub fn pace_bodies(router: Router, pace: Pace, metrics: Arc<Metrics>) -> Router {
    router.layer(axum::middleware::map_request(move |req: Request| {
        let metrics = metrics.clone();
        async move { req.map(|b| Body::new(PacedBody::new(b, pace, metrics))) }
    }))
}

/// A request body that fails with a [`BodyTimeout`] when its client is too
/// slow. Only time spent waiting for the client counts: while the server
/// does not ask for more (the engine is busy, the queue to it full), the
/// clocks stand still, so a client is never cut for the server's slowness.
pub struct PacedBody {
    inner: Body,
    pace: Pace,
    metrics: Arc<Metrics>,
    /// Time waited since the last byte.
    since_byte: Duration,
    /// Time waited and bytes received in the current rate window.
    window_waited: Duration,
    window_bytes: u64,
    /// The consumer's current wait for the client.
    clock: WaitClock,
    cut: bool,
}

impl PacedBody {
    pub fn new(inner: Body, pace: Pace, metrics: Arc<Metrics>) -> PacedBody {
        PacedBody {
            inner,
            pace,
            metrics,
            since_byte: Duration::ZERO,
            window_waited: Duration::ZERO,
            window_bytes: 0,
            clock: WaitClock::default(),
            cut: false,
        }
    }

    /// How long the next wait may last before the pace must be checked.
    fn budget(&self) -> Option<Duration> {
        let idle = self.pace.idle.map(|d| d.saturating_sub(self.since_byte));
        let window = self
            .pace
            .window
            .map(|w| w.saturating_sub(self.window_waited));
        match (idle, window) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Counts `waited` (time spent waiting for the client) that brought `n`
    /// bytes; fails if the body has fallen behind its pace.
    fn account(&mut self, waited: Duration, n: u64) -> Result<(), BodyTimeout> {
        self.since_byte = if n > 0 {
            Duration::ZERO
        } else {
            self.since_byte + waited
        };
        if let Some(idle) = self.pace.idle.filter(|d| self.since_byte >= *d) {
            return Err(BodyTimeout::Idle(idle));
        }
        let Some(window) = self.pace.window else {
            return Ok(());
        };
        self.window_waited += waited;
        self.window_bytes += n;
        if self.window_waited >= window {
            let due = self.pace.min_rate as u128 * self.window_waited.as_millis() / 1000;
            if (self.window_bytes as u128) < due {
                return Err(BodyTimeout::Rate {
                    min_rate: self.pace.min_rate,
                    window,
                });
            }
            self.window_waited = Duration::ZERO;
            self.window_bytes = 0;
        }
        Ok(())
    }

    fn fail(&mut self, t: BodyTimeout) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        self.cut = true;
        self.metrics.timeout(t.kind());
        tracing::info!(error = %t, "request body cut");
        Poll::Ready(Some(Err(Box::new(t))))
    }
}

impl http_body::Body for PacedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.cut {
            return Poll::Ready(None);
        }
        loop {
            if let Poll::Ready(item) = Pin::new(&mut this.inner).poll_frame(cx) {
                let waited = this.clock.stop();
                let n = match &item {
                    Some(Ok(f)) => f.data_ref().map_or(0, |d| d.len() as u64),
                    _ => 0,
                };
                if let Err(t) = this.account(waited, n) {
                    return this.fail(t);
                }
                return Poll::Ready(item.map(|r| r.map_err(Into::into)));
            }
            let Some(budget) = this.budget() else {
                return Poll::Pending;
            };
            if this.clock.poll_wait(cx, budget).is_pending() {
                return Poll::Pending;
            }
            // The budget ran out while waiting: count the wait, then go on
            // waiting (a new rate window) or cut the body.
            let waited = this.clock.stop();
            if let Err(t) = this.account(waited, 0) {
                return this.fail(t);
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.cut || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(idle: u64, min_rate: u64, window: u64) -> LimitArgs {
        LimitArgs {
            header_timeout: Duration::ZERO,
            tls_handshake_timeout: Duration::ZERO,
            max_connections: 1,
            max_connections_per_client: 1,
            body_idle_timeout: Duration::from_secs(idle),
            body_min_rate: min_rate,
            body_rate_window: Duration::from_secs(window),
            send_timeout: Duration::ZERO,
            tcp_keepalive: Duration::ZERO,
            max_backups: 0,
        }
    }

    fn pace(idle: u64, min_rate: u64, window: u64) -> PacedBody {
        let a = args(idle, min_rate, window);
        PacedBody::new(Body::empty(), Pace::new(&a), Arc::new(Metrics::new()))
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_body_that_stops_is_cut_after_the_idle_timeout() {
        let mut p = pace(10, 0, 0);
        assert_eq!(p.budget(), Some(10 * S));
        p.account(4 * S, 0).unwrap();
        assert_eq!(p.budget(), Some(6 * S));
        p.account(5 * S, 1).unwrap(); // a byte resets the clock
        assert_eq!(p.budget(), Some(10 * S));
        assert_eq!(p.account(10 * S, 0), Err(BodyTimeout::Idle(10 * S)));
    }

    #[test]
    fn a_body_below_the_rate_over_a_window_is_cut() {
        let mut p = pace(0, 100, 10);
        // 1000 bytes in 10 s of waiting: exactly the rate.
        for _ in 0..10 {
            p.account(S, 100).unwrap();
        }
        assert_eq!(p.budget(), Some(10 * S), "a new window began");
        // A trickle: one byte a second.
        for _ in 0..9 {
            p.account(S, 1).unwrap();
        }
        assert_eq!(
            p.account(S, 1),
            Err(BodyTimeout::Rate {
                min_rate: 100,
                window: 10 * S
            })
        );
    }

    #[test]
    fn the_wait_budget_is_the_nearer_of_idle_and_window() {
        let mut p = pace(5, 100, 10);
        p.account(3 * S, 2000).unwrap();
        assert_eq!(p.budget(), Some(5 * S), "idle clock reset by the bytes");
        p.account(4 * S, 0).unwrap();
        assert_eq!(p.budget(), Some(S), "idle: 1 s left");
        p.account(S / 2, 10).unwrap();
        assert_eq!(p.budget(), Some(5 * S / 2), "window: 2.5 s left");
        assert_eq!(pace(0, 0, 10).budget(), None, "no rate: no window");
    }

    #[test]
    fn caps_leave_half_the_open_files_to_the_store() {
        let caps = |max, per, files| {
            let a = LimitArgs {
                max_connections: max,
                max_connections_per_client: per,
                ..args(0, 0, 0)
            };
            connection_caps(&a, files)
        };
        assert_eq!(caps(4096, 256, 1 << 20), (4096, 256));
        assert_eq!(caps(4096, 256, 256), (128, 128));
        assert_eq!(caps(100, 10, 1024), (100, 10));
    }
}
