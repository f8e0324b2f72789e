//! Running engine work for a handler: on the blocking pool, counted as in
//! flight (shutdown waits for it or cancels it), with upload bodies read
//! through a [`BodyReader`] and restores written into a response body.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::HeaderMap;

use revault_engine::{ErrorKind, RestoreOptions, RestoreReport, Store};

use super::error::{ApiError, ApiResult};
use super::request::content_length;
use super::stream::{BodyPump, BodyReader, ChannelWriter};
use super::wire::ApiCode;
use super::App;

/// How long an upload waits for a slide or expiry of its series to finish.
const BUSY_WAIT: Duration = Duration::from_secs(120);

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a worker task failed: {e}")))?
}

/// Runs an upload's `attempt` again while a slide or expiry holds its series
/// (`busy`), for at most [`BUSY_WAIT`]: only while nothing of the body has been
/// read (retries share one body reader) and not once the server drains.
pub(crate) fn retry_while_busy<T, E>(
    app: &App,
    reader: &BodyReader,
    busy: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let waited = Instant::now();
    loop {
        match attempt() {
            Err(e)
                if busy(&e)
                    && !reader.started()
                    && waited.elapsed() < BUSY_WAIT
                    && !app.draining.load(Ordering::SeqCst) =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

/// Runs an upload (`what`: "backup", "upload") on the blocking pool, counted
/// as in flight: `run` gets a reader of the request body and the flag that
/// shutdown sets to cancel it.
///
/// A failure is answered at once while the pump goes on reading the rest of
/// the body (bounded), so the client reads the error instead of a reset
/// connection; an upload
/// cancelled by shutdown answers 503, and one whose body came too slowly
/// 408, saying what was `lost`.
pub(crate) async fn run_upload<T, E>(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Body,
    what: &str,
    lost: &str,
    run: impl FnOnce(&App, BodyReader, Arc<AtomicBool>) -> Result<T, E> + Send + 'static,
) -> ApiResult<T>
where
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
{
    let (pump, reader) = BodyPump::start(
        body,
        content_length(headers),
        app.abort.subscribe(),
        app.metrics.clone(),
    );
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = app.begin(Some(cancel.clone()));
    let a = app.clone();
    let result = tokio::task::spawn_blocking(move || {
        let _g = guard;
        run(&a, reader, cancel)
    })
    .await
    .map_err(|e| ApiError::internal(format!("the {what} task failed: {e}")))?;
    let mut err: ApiError = match result {
        Ok(t) => return Ok(t),
        Err(e) => e.into(),
    };
    let timed_out = pump.timed_out();
    // Answer now; the pump goes on reading (and discarding) what the client still sends, so
    // the connection is not reset under a client that is still sending and the client reads
    // this error instead of a broken pipe.
    drop(pump);
    if let Some(t) = timed_out.filter(|_| err.status.is_client_error()) {
        err = ApiError::body_timeout(&t, lost);
    } else if err.code == ApiCode::Engine(ErrorKind::Cancelled)
        && app.draining.load(Ordering::SeqCst)
    {
        err = ApiError::shutting_down(format!(
            "the server shut down before the {what} completed; {lost}"
        ));
    } else if err.code == ApiCode::Engine(ErrorKind::Cancelled) && app.health.refusal().is_some() {
        err = ApiError::unavailable(format!(
            "the server reopened its store (recovering from a full disk) before the {what} completed; {lost}"
        ));
    }
    Err(err)
}

/// Runs engine work on the blocking pool, counted as in flight (shutdown
/// waits for it): `f` gets the app and the store.
pub(crate) async fn guarded<T: Send + 'static>(
    app: &Arc<App>,
    f: impl FnOnce(&App, &Store) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    let store = app.store()?;
    let guard = app.begin(None);
    let a = app.clone();
    blocking(move || {
        let _g = guard;
        f(&a, &store)
    })
    .await
}

/// Streams a restore (`run`, on the blocking pool) into a response body. A
/// failure ends the body with an error, so a client never takes a short body
/// for a whole one; `done` sees the outcome after that (reports, logs).
pub(crate) fn restore_body(
    app: &Arc<App>,
    mut opts: RestoreOptions,
    sending: &'static str,
    run: impl FnOnce(&RestoreOptions, &mut ChannelWriter) -> revault_engine::Result<RestoreReport>
        + Send
        + 'static,
    done: impl FnOnce(&App, revault_engine::Result<RestoreReport>) + Send + 'static,
) -> Body {
    let (mut writer, body) =
        ChannelWriter::new(app.metrics.clone(), opts.cache_bytes, app.abort.subscribe());
    let cancel = Arc::new(AtomicBool::new(false));
    opts.cancel = Some(cancel.clone());
    let guard = app.begin(Some(cancel));
    let a = app.clone();
    tokio::task::spawn_blocking(move || {
        let _g = guard;
        // A panic is an internal error like any other: the body ends in it
        // and `done` still runs (it releases the restore's gauges).
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let rep = run(&opts, &mut writer)?;
            writer.complete().map_err(|e| revault_engine::Error::Io {
                context: sending.into(),
                source: e,
            })?;
            Ok(rep)
        }))
        .unwrap_or_else(|p| Err(revault_engine::panicked("restore", p)));
        match &r {
            Ok(rep) => {
                a.metrics.container_reads.inc_by(rep.container_reads);
                a.metrics.restore_bytes_read.inc_by(rep.bytes_read);
            }
            Err(e) => {
                a.metrics.error(e.code());
                writer.fail(e.to_string());
            }
        }
        done(&a, r);
    });
    body
}
