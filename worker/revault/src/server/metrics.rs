//! Prometheus metrics (text format at `/metrics`).
//!
//! Store-wide figures are for anyone who can reach `/metrics`; the
//! per-series gauges name series and buckets, so they are shown only to a
//! token, for the namespaces it may see (see [`Metrics::encode`]).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry, Unit};

use super::auth::Scope;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SeriesLabel {
    pub series: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabel {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub method: String,
    pub route: String,
}

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn maintenance_histogram() -> Histogram {
    // 10 ms .. ~10 min
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
}

pub struct Metrics {
    registry: Registry,
    pub bytes_in: Counter,
    pub bytes_out: Counter,
    pub backups: Family<ResultLabel, Counter>,
    pub restores: Family<ResultLabel, Counter>,
    pub backup_logical_bytes: Counter,
    pub backup_new_bytes: Counter,
    pub container_reads: Counter,
    pub restore_bytes_read: Counter,
    pub speed_factor: Histogram,
    pub maintenance_seconds: HistFamily<OpLabel>,
    pub maintenance_runs: Family<ResultLabel, Counter>,
    pub errors: Family<CodeLabel, Counter>,
    pub requests: Family<RequestLabel, Counter>,
    pub request_seconds: HistFamily<RouteLabel>,
    pub inflight_backups: Gauge,
    pub queued_backups: Gauge,
    pub inflight_restores: Gauge,
    pub stored_bytes: Gauge,
    pub logical_bytes: Gauge,
    pub unique_bytes: Gauge,
    pub versions: Gauge,
    pub containers: Gauge,
    pub dedup_ratio: Gauge<f64, AtomicU64>,
    /// Per series (buckets included): (logical bytes, new bytes).
    series: Mutex<BTreeMap<String, (u64, u64)>>,
    pub tokens: Gauge,
    pub open_connections: Gauge,
    pub rejected_connections: Family<ReasonLabel, Counter>,
    pub timeouts: Family<KindLabel, Counter>,
    /// 1 while the metadata takes no writes (see `health`).
    pub store_degraded: Gauge,
    pub store_reopens: Counter,
    /// The durable tier (see `durable`): syncs by result, bytes uploaded, objects deleted,
    /// Object Lock retentions extended, and how far the bucket is behind (set at each scrape).
    pub remote_syncs: Family<ResultLabel, Counter>,
    pub remote_uploaded_bytes: Counter,
    pub remote_deleted_objects: Counter,
    pub remote_locks_extended: Counter,
    pub remote_lag_seconds: Gauge<f64, AtomicU64>,
    pub remote_fenced: Gauge,
}

/// The registry being filled: each metric is made, named and described in
/// one place, and registered in the order written (the exposition's order).
struct Registering(Registry);

impl Registering {
    fn add<M: Metric + Clone>(&mut self, name: &str, help: &str, m: M) -> M {
        self.0.register(name, help, m.clone());
        m
    }

    fn with_unit<M: Metric + Clone>(&mut self, name: &str, help: &str, unit: Unit, m: M) -> M {
        self.0.register_with_unit(name, help, unit, m.clone());
        m
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut r = Registering(Registry::with_prefix("revault"));
        Metrics {
            bytes_in: r.with_unit(
                "received",
                "Request body bytes received (backups)",
                Unit::Bytes,
                Counter::default(),
            ),
            bytes_out: r.with_unit(
                "sent",
                "Response body bytes sent (restores)",
                Unit::Bytes,
                Counter::default(),
            ),
            backups: r.add("backups", "Backups finished, by result", Family::default()),
            restores: r.add("restores", "Restores finished, by result", Family::default()),
            backup_logical_bytes: r.with_unit(
                "backup_logical",
                "Logical bytes of committed backups",
                Unit::Bytes,
                Counter::default(),
            ),
            backup_new_bytes: r.with_unit(
                "backup_new",
                "New unique bytes (uncompressed) committed backups added",
                Unit::Bytes,
                Counter::default(),
            ),
            container_reads: r.add(
                "container_reads",
                "Container reads made by restores",
                Counter::default(),
            ),
            restore_bytes_read: r.with_unit(
                "restore_read",
                "Container bytes read by restores",
                Unit::Bytes,
                Counter::default(),
            ),
            // Speed factor: MiB restored per container read; 4 MiB containers
            // give at most ~4, dedup and fragmentation less.
            speed_factor: r.add(
                "restore_speed_factor",
                "Speed factor of restores (MiB restored per container read)",
                Histogram::new([
                    0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 6.0, 8.0,
                ]),
            ),
            maintenance_seconds: r.with_unit(
                "maintenance_duration",
                "Duration of slides, expiries and gc runs",
                Unit::Seconds,
                Family::new_with_constructor(maintenance_histogram as fn() -> Histogram),
            ),
            maintenance_runs: r.add(
                "maintenance_runs",
                "Scheduled maintenance runs, by result",
                Family::default(),
            ),
            errors: r.add("errors", "Error responses, by code", Family::default()),
            requests: r.add(
                "http_requests",
                "HTTP requests, by method, route and status",
                Family::default(),
            ),
            request_seconds: r.with_unit(
                "http_request_duration",
                "Time to the response head (bodies stream after)",
                Unit::Seconds,
                Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            ),
            inflight_backups: r.add("inflight_backups", "Backups in progress", Gauge::default()),
            queued_backups: r.add(
                "queued_backups",
                "Backups waiting for a slot (--max-backups)",
                Gauge::default(),
            ),
            inflight_restores: r.add(
                "inflight_restores",
                "Restores in progress",
                Gauge::default(),
            ),
            stored_bytes: r.with_unit(
                "stored",
                "Container bytes on disk (compressed)",
                Unit::Bytes,
                Gauge::default(),
            ),
            logical_bytes: r.with_unit(
                "logical",
                "Logical bytes of every stored version",
                Unit::Bytes,
                Gauge::default(),
            ),
            unique_bytes: r.with_unit(
                "unique",
                "Unique bytes held by live units (uncompressed)",
                Unit::Bytes,
                Gauge::default(),
            ),
            versions: r.add("versions", "Stored versions", Gauge::default()),
            containers: r.add("containers", "Container files", Gauge::default()),
            dedup_ratio: r.add(
                "dedup_ratio",
                "Store dedup ratio: logical bytes / unique bytes",
                Gauge::default(),
            ),
            tokens: r.add("tokens", "Bearer tokens loaded", Gauge::default()),
            store_degraded: r.add(
                "store_degraded",
                "1 while the store's metadata takes no writes (a full disk): new work is refused, reads are served",
                Gauge::default(),
            ),
            store_reopens: r.add(
                "store_reopens",
                "Times the server closed and reopened its store to recover from a degraded state",
                Counter::default(),
            ),
            open_connections: r.add(
                "open_connections",
                "Open client connections",
                Gauge::default(),
            ),
            rejected_connections: r.add(
                "rejected_connections",
                "Connections closed at once for a connection cap, by reason",
                Family::default(),
            ),
            timeouts: r.add(
                "timeouts",
                "Connections and requests cut by a timeout, by kind",
                Family::default(),
            ),
            remote_syncs: r.add(
                "remote_syncs",
                "Syncs of the store to its remote (S3 bucket), by result",
                Family::default(),
            ),
            remote_uploaded_bytes: r.with_unit(
                "remote_uploaded",
                "Bytes uploaded to the remote (containers and metadata, before sealing)",
                Unit::Bytes,
                Counter::default(),
            ),
            remote_deleted_objects: r.add(
                "remote_deleted_objects",
                "Objects deleted from the remote (freed containers, old metadata)",
                Counter::default(),
            ),
            remote_locks_extended: r.add(
                "remote_locks_extended",
                "Objects still needed whose Object Lock retention was extended",
                Counter::default(),
            ),
            remote_lag_seconds: r.with_unit(
                "remote_lag",
                "Age of the oldest change the remote does not hold yet (0: it holds everything)",
                Unit::Seconds,
                Gauge::default(),
            ),
            remote_fenced: r.add(
                "remote_fenced",
                "1 when the store was recovered elsewhere (a newer generation owns its remote): it takes no writes",
                Gauge::default(),
            ),
            series: Mutex::new(BTreeMap::new()),
            registry: r.0,
        }
    }

    /// The exposition for a caller who may see the series of `scope`
    /// (`None`: no token, store-wide figures only).
    pub fn encode(&self, scope: Option<&Scope>) -> String {
        use prometheus_client::encoding::text;
        let mut out = String::new();
        let fine = "encoding metrics into a String cannot fail";
        text::encode_registry(&mut out, &self.registry).expect(fine);
        if let Some(scope) = scope {
            text::encode_registry(&mut out, &self.series_registry(scope)).expect(fine);
        }
        text::encode_eof(&mut out).expect(fine);
        out
    }

    /// The per-series gauges of the series in `scope`, built for one scrape.
    fn series_registry(&self, scope: &Scope) -> Registry {
        let ratio: Family<SeriesLabel, Gauge<f64, AtomicU64>> = Family::default();
        let logical: Family<SeriesLabel, Gauge> = Family::default();
        for (name, (l, new)) in self.series.lock().unwrap().iter() {
            let ns = name.split('/').next().unwrap_or_default();
            if !scope.allows(ns) {
                continue;
            }
            let label = SeriesLabel {
                series: name.clone(),
            };
            let r = if *new > 0 {
                *l as f64 / *new as f64
            } else {
                0.0
            };
            ratio.get_or_create(&label).set(r);
            logical.get_or_create(&label).set(*l as i64);
        }
        let mut r = Registry::with_prefix("revault");
        r.register(
            "series_dedup_ratio",
            "Per series: logical bytes of its versions / new bytes they added",
            ratio,
        );
        r.register_with_unit(
            "series_logical",
            "Per series: logical bytes of its versions",
            Unit::Bytes,
            logical,
        );
        r
    }

    pub fn reject(&self, reason: &str) {
        self.rejected_connections
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn timeout(&self, kind: &str) {
        self.timeouts
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    pub fn error(&self, code: &str) {
        self.errors
            .get_or_create(&CodeLabel {
                code: code.to_string(),
            })
            .inc();
    }

    pub fn maintenance(&self, op: &str, secs: f64) {
        self.maintenance_seconds
            .get_or_create(&OpLabel { op: op.to_string() })
            .observe(secs);
    }

    pub fn result(f: &Family<ResultLabel, Counter>, ok: bool) {
        f.get_or_create(&ResultLabel {
            result: if ok { "ok" } else { "error" }.to_string(),
        })
        .inc();
    }

    /// Per-series figures from the series' stored versions.
    pub fn set_series(&self, series: &str, logical: u64, new: u64, present: bool) {
        let mut all = self.series.lock().unwrap();
        if present {
            all.insert(series.to_string(), (logical, new));
        } else {
            all.remove(series);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_gauges_follow_the_scope() {
        let m = Metrics::new();
        m.set_series("team-a/db", 300, 100, true);
        m.set_series("team-b/bucket", 50, 50, true);
        m.set_series("team-b/gone", 1, 1, true);
        m.set_series("team-b/gone", 0, 0, false);
        let none = m.encode(None);
        assert!(!none.contains("team-"), "{none}");
        assert!(none.contains("revault_versions "), "{none}");
        let a = m.encode(Some(&Scope::Namespaces(["team-a".to_string()].into())));
        assert!(
            a.contains("revault_series_dedup_ratio{series=\"team-a/db\"} 3.0"),
            "{a}"
        );
        assert!(!a.contains("team-b"), "{a}");
        let all = m.encode(Some(&Scope::All));
        assert!(
            all.contains("revault_series_logical_bytes{series=\"team-b/bucket\"} 50"),
            "{all}"
        );
        assert!(!all.contains("gone"), "{all}");
        assert_eq!(all.matches("# EOF").count(), 1);
        assert!(all.ends_with("# EOF\n"));
    }
}
