//! The durable tier while the store is busy: restores reading evicted containers from the
//! bucket while expiry, gc and syncs free and delete them; backups, slides, expiries, gc,
//! evictions and syncs all at once, then a rebuild from the bucket.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use revault_engine::{
    restore, DedupUnit, ExpireSel, GcOptions, RestoreOptions, RestoreTarget, Retention, VersionSel,
    KIB,
};
use revault_remote::{recover, EvictOptions, RecoverOptions};

/// A restore is paused after its first window while its version is expired, gc frees its
/// containers and a sync runs: the containers it reads from the bucket must stay there until
/// it ends, and it must restore byte-exact. Then they go.
#[test]
fn a_restore_from_the_bucket_outlives_the_expiry_of_its_version() {
    let url = fresh_url("restore-race");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    // Over 4 MiB: the restore reports progress (where it pauses) before its end.
    let old = version_data(4, 0, 6_000_000);
    backup_bytes(&store, "ns/a", &old, DedupUnit::Chunk);
    let new = random(600_000, 99);
    backup_bytes(&store, "ns/a", &new, DedupUnit::Chunk);
    remote.sync(&store).unwrap();
    // Version 1's containers live only in the bucket.
    let live = revault_engine::live_containers(&store).unwrap();
    let objects_before = s3().objects(&url).len();
    for (name, _) in s3().objects(&url) {
        if let Some(hex) = name.strip_prefix("data/") {
            let id = revault_engine::ContainerId(u64::from_str_radix(hex, 16).unwrap());
            let _ = live;
            store.evict_container(id).unwrap();
        }
    }
    let (paused_tx, paused_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = Mutex::new(Some(go_rx));
    let paused_tx = Mutex::new(Some(paused_tx));
    let opts = RestoreOptions {
        cache_bytes: 64 * KIB,
        progress: Some(Arc::new(move |_| {
            if let Some(tx) = paused_tx.lock().unwrap().take() {
                tx.send(()).unwrap();
                go_rx.lock().unwrap().take().unwrap().recv().unwrap();
            }
        })),
        ..Default::default()
    };
    std::thread::scope(|sc| {
        let st = &store;
        let h = sc.spawn(move || {
            let mut out = Vec::new();
            restore(
                st,
                "ns/a",
                VersionSel::Number(1),
                &opts,
                RestoreTarget::Writer(&mut out),
            )
            .map(|_| out)
        });
        if paused_rx.recv().is_err() {
            panic!(
                "the restore ended before its first window: {:?}",
                h.join().unwrap().err()
            );
        }
        revault_engine::expire(&store, "ns/a", &ExpireSel::Version(1)).unwrap();
        revault_engine::gc(
            &store,
            &GcOptions {
                full: true,
                compact_below: 0.9,
            },
        )
        .unwrap();
        remote.sync(&store).unwrap();
        assert!(
            !store.freed_awaiting_readers().is_empty(),
            "the paused restore holds version 1's containers"
        );
        let during: Vec<String> = s3().objects(&url).into_iter().map(|(n, _)| n).collect();
        go_tx.send(()).unwrap();
        let got = h.join().unwrap().expect("the restore finishes");
        assert!(got == old, "the paused restore is byte-exact");
        assert!(
            during.len() >= objects_before - 1,
            "the bucket kept what the restore reads"
        );
    });
    remote.sync(&store).unwrap();
    let left: Vec<String> = s3()
        .objects(&url)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("data/"))
        .collect();
    let mut want = Vec::new();
    store
        .meta()
        .for_each_prefix(revault_engine::keys::CF_CONTAINERS, b"", |k, _| {
            want.push(format!(
                "data/{:016x}",
                u64::from_be_bytes(k.try_into().unwrap())
            ));
            Ok(true)
        })
        .unwrap();
    want.sort();
    let mut left = left;
    left.sort();
    assert_eq!(
        left, want,
        "once the restore ended, version 1's containers left the bucket"
    );
}

/// Everything at once for a few seconds: two backup threads over three series (both units,
/// shared content), a maintenance thread (slides, expiries, gc), an evictor, a restorer
/// reading what it can, and a syncer. At the end one more sync, and a store rebuilt from the
/// bucket holds exactly what the store holds, byte-exact.
#[test]
fn backups_maintenance_evictions_restores_and_syncs_at_once() {
    let url = fresh_url("busy");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    for s in ["ns/a", "ns/b", "ns/c"] {
        revault_engine::set_retention(
            &store,
            s,
            Retention {
                live: 1,
                keep: Some(4),
                auto: false,
                ..Default::default()
            },
        )
        .unwrap();
    }
    let model: Mutex<BTreeMap<(String, u32), Vec<u8>>> = Mutex::new(BTreeMap::new());
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(8);
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for (t, series) in [(0u64, ["ns/a", "ns/b"]), (1, ["ns/c", "ns/a"])] {
            let (store, model, stop) = (&store, &model, &stop);
            sc.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let s = series[(i % 2) as usize];
                    let unit = if s == "ns/b" {
                        DedupUnit::Chunk
                    } else {
                        DedupUnit::Segment
                    };
                    let d = version_data(10 + (i % 3), i + t * 100, 150_000);
                    let src =
                        revault_engine::StreamSource::new("t", std::io::Cursor::new(d.clone()));
                    match revault_engine::backup(
                        store,
                        s,
                        Box::new(src),
                        &revault_engine::BackupOptions {
                            unit: Some(unit),
                            ..Default::default()
                        },
                    ) {
                        Ok(r) => {
                            model.lock().unwrap().insert((s.to_string(), r.version), d);
                        }
                        Err(e) if e.code() == "series_busy" => {}
                        Err(e) => panic!("backup: {e}"),
                    }
                    i += 1;
                }
            });
        }
        let (st, stop_, errs) = (&store, &stop, &errors);
        sc.spawn(move || {
            let mut i = 0;
            while !stop_.load(Ordering::SeqCst) {
                let s = ["ns/a", "ns/b", "ns/c"][i % 3];
                let r = match i % 3 {
                    0 => revault_engine::slide(st, s).map(|_| ()),
                    1 => revault_engine::expire(st, s, &ExpireSel::Retention).map(|_| ()),
                    _ => revault_engine::gc(
                        st,
                        &GcOptions {
                            full: i % 2 == 0,
                            compact_below: 0.7,
                        },
                    )
                    .map(|_| ()),
                };
                if let Err(e) = r {
                    if e.code() != "series_busy" && e.code() != "unknown_series" {
                        errs.lock().unwrap().push(format!("maintenance: {e}"));
                    }
                }
                i += 1;
            }
        });
        let (st, rm, stop_, errs) = (&store, &remote, &stop, &errors);
        sc.spawn(move || {
            while !stop_.load(Ordering::SeqCst) {
                if let Err(e) = rm.sync(st) {
                    errs.lock().unwrap().push(format!("sync: {e}"));
                }
                if let Err(e) = rm.evict(
                    st,
                    &EvictOptions {
                        older_than: Duration::ZERO,
                    },
                ) {
                    errs.lock().unwrap().push(format!("evict: {e}"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (st, model_, stop_, errs) = (&store, &model, &stop, &errors);
        sc.spawn(move || {
            let mut k = 0usize;
            while !stop_.load(Ordering::SeqCst) {
                let pick = {
                    let m = model_.lock().unwrap();
                    m.iter()
                        .nth(k % m.len().max(1))
                        .map(|(key, d)| (key.clone(), d.clone()))
                };
                k += 7;
                let Some(((s, v), data)) = pick else { continue };
                match restore_bytes(st, &s, v) {
                    Ok(got) => {
                        if got != data {
                            errs.lock().unwrap().push(format!("{s} v{v}: wrong bytes"));
                        }
                    }
                    // Expired by retention meanwhile: not a fault.
                    Err(e) if e.code() == "unknown_version" => {}
                    Err(e) => errs.lock().unwrap().push(format!("restore {s} v{v}: {e}")),
                }
            }
        });
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::SeqCst);
    });
    let errors = errors.into_inner().unwrap();
    assert!(errors.is_empty(), "{errors:#?}");
    remote.sync(&store).unwrap();
    let model = model.into_inner().unwrap();
    let mut expected = Vec::new();
    for s in ["ns/a", "ns/b", "ns/c"] {
        let Ok(rec) = store.series(s) else { continue };
        let listed: Vec<(u32, Vec<u8>)> = store
            .versions(&rec)
            .unwrap()
            .iter()
            .map(|v| (v.number, model[&(s.to_string(), v.number)].clone()))
            .collect();
        expected.push((s, listed));
    }
    let total: usize = expected.iter().map(|(_, v)| v.len()).sum();
    assert!(
        total >= 3,
        "the run backed up too little to mean anything ({total})"
    );
    assert_holds(&store, &expected);
    let rebuilt = tempfile::tempdir().unwrap();
    let (s2, _r2, _) = recover(&RecoverOptions {
        url,
        key_file: dir.path().join("key"),
        store: rebuilt.path().to_path_buf(),
        data_dir: None,
        lazy: false,
    })
    .unwrap();
    assert_holds(&s2, &expected);
    let rep = revault_engine::check(&s2).unwrap();
    assert!(rep.ok, "{:?}", rep.errors);
}
