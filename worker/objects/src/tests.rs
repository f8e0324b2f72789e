//! The object API against a store: round trips, listings in pages,
//! overwrites and deletes that free their versions, gzip uploads, dedup of
//! unchanged tar members, and buckets kept apart from backup series.

use std::io;

use revault_engine::{
    expire, keys::object_key, BackupOptions, ExpireSel, InitOptions, OpenMode, RestoreOptions,
    Store,
};

use crate::records::CF;
use crate::testdata::{gunzip, gzip, pseudo_random, tarball};
use crate::*;

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    Store::init(dir.path(), &InitOptions::default()).unwrap();
    let s = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
    (dir, s)
}

fn try_put(
    o: &Objects,
    s: &Store,
    bucket: &str,
    key: &str,
    body: Vec<u8>,
    enc: Encoding,
) -> ObjResult<PutReport> {
    o.put(
        s,
        bucket,
        key,
        Box::new(io::Cursor::new(body)),
        &PutOptions {
            encoding: enc,
            ..Default::default()
        },
    )
}

fn put(o: &Objects, s: &Store, bucket: &str, key: &str, body: Vec<u8>, enc: Encoding) -> PutReport {
    try_put(o, s, bucket, key, body, enc).unwrap()
}

fn get(s: &Store, bucket: &str, key: &str, decoded: bool) -> Vec<u8> {
    let info = head(s, bucket, key).unwrap();
    let mut out = Vec::new();
    read(s, &info, decoded, &RestoreOptions::default(), &mut out).unwrap();
    out
}

#[test]
fn put_get_list_overwrite_delete() {
    let (_d, s) = store();
    let o = Objects::new();
    let b = "velero/bsl";
    assert!(list(&s, b, "", Some("/"), None, 100)
        .unwrap()
        .objects
        .is_empty());
    for k in [
        "backups/b1/b1.json",
        "backups/b1/b1-logs.gz",
        "backups/b2/b2.json",
        "metadata/revision",
    ] {
        put(
            &o,
            &s,
            b,
            k,
            format!("content of {k}").into_bytes(),
            Encoding::Identity,
        );
    }
    assert!(is_bucket(s.meta(), b).unwrap());
    // Its versions are different objects: never slid one into the next (a new backup series
    // slides by default; a bucket must not).
    let r = s.series(b).unwrap().retention;
    assert!(!r.auto, "a bucket's retention is automatic: {r:?}");
    assert_eq!(
        s.series(b)
            .and_then(|rec| s.versions(&rec))
            .unwrap()
            .iter()
            .filter(|v| v.form != revault_engine::RecipeForm::Live)
            .count(),
        0,
        "a bucket version was slid"
    );
    let l = list(&s, b, "backups/", Some("/"), None, 100).unwrap();
    assert_eq!(l.common_prefixes, ["backups/b1/", "backups/b2/"]);
    assert!(l.objects.is_empty());
    let l = list(&s, b, "backups/b1/", None, None, 100).unwrap();
    let keys: Vec<_> = l.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["backups/b1/b1-logs.gz", "backups/b1/b1.json"]);
    // Pages of one entry each walk the same listing.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let p = list(&s, b, "", Some("/"), after.as_deref(), 1).unwrap();
        seen.extend(p.common_prefixes.clone());
        seen.extend(p.objects.iter().map(|o| o.key.clone()));
        match p.next_start_after {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, ["backups/", "metadata/"]);

    assert_eq!(
        get(&s, b, "metadata/revision", false),
        b"content of metadata/revision"
    );
    let v1 = head(&s, b, "metadata/revision").unwrap().record.version;
    let r = put(
        &o,
        &s,
        b,
        "metadata/revision",
        b"new".to_vec(),
        Encoding::Identity,
    );
    assert_eq!(r.replaced.as_ref().unwrap().expired, [v1]);
    assert_eq!(get(&s, b, "metadata/revision", false), b"new");
    let series = s.series(b).unwrap();
    assert_eq!(
        s.versions(&series).unwrap().len(),
        4,
        "the old content's version is gone"
    );

    let d = o.delete(&s, b, "backups/b2/b2.json").unwrap();
    assert_eq!(d.expired.expired, [d.version]);
    assert!(matches!(
        head(&s, b, "backups/b2/b2.json"),
        Err(ObjectError::NotFound { .. })
    ));
    assert!(matches!(
        o.delete(&s, b, "backups/b2/b2.json"),
        Err(ObjectError::NotFound { .. })
    ));
    let l = list(&s, b, "backups/", Some("/"), None, 100).unwrap();
    assert_eq!(l.common_prefixes, ["backups/b1/"]);
    let sum = summary(&s, b).unwrap();
    assert_eq!(sum.objects, 3);
}

#[test]
fn gzip_objects_are_served_compressed_with_the_same_content() {
    let (_d, s) = store();
    let o = Objects::new();
    let t = tarball(&[("resources/a.json", pseudo_random(9000, 4))], 5);
    let gz = gzip(&t);
    let r = put(
        &o,
        &s,
        "velero/bsl",
        "backups/x/x.tar.gz",
        gz.clone(),
        Encoding::Gzip,
    );
    assert_eq!(r.object.record.size, t.len() as u64);
    assert_eq!(r.object.record.uploaded_bytes, gz.len() as u64);
    assert_eq!(r.object.record.tar_members, 1);
    let served = get(&s, "velero/bsl", "backups/x/x.tar.gz", false);
    assert_eq!(&served[..2], &[0x1f, 0x8b], "a gzip stream");
    assert_eq!(gunzip(&served), t);
    assert_eq!(get(&s, "velero/bsl", "backups/x/x.tar.gz", true), t);

    let e = try_put(
        &o,
        &s,
        "velero/bsl",
        "bad.gz",
        b"not gzip at all".to_vec(),
        Encoding::Gzip,
    )
    .unwrap_err();
    assert_eq!(e.code(), "bad_gzip", "{e}");
    assert!(matches!(
        head(&s, "velero/bsl", "bad.gz"),
        Err(ObjectError::NotFound { .. })
    ));
}

#[test]
fn unchanged_tar_members_dedup_whatever_their_headers_say() {
    let (_d, s) = store();
    let o = Objects::new();
    let files: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| {
            (
                format!("resources/cm/namespaces/ns/cm{i}.json"),
                pseudo_random(2000 + i * 37, i as u64),
            )
        })
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(n, d)| (n.as_str(), d.clone())).collect();
    let first = put(
        &o,
        &s,
        "velero/bsl",
        "b1.tar.gz",
        gzip(&tarball(&refs, 1000)),
        Encoding::Gzip,
    );
    // Same contents, every header's mtime different.
    let second = put(
        &o,
        &s,
        "velero/bsl",
        "b2.tar.gz",
        gzip(&tarball(&refs, 2000)),
        Encoding::Gzip,
    );
    assert!(first.backup.new_vbytes > 400_000);
    assert!(
        second.backup.new_vbytes * 10 < first.backup.new_vbytes,
        "only the headers are new: {} vs {}",
        second.backup.new_vbytes,
        first.backup.new_vbytes
    );
}

#[test]
fn buckets_and_backup_series_do_not_mix_and_sweep_removes_orphans() {
    let (_d, s) = store();
    let o = Objects::new();
    revault_engine::backup(
        &s,
        "team/db",
        Box::new(revault_engine::StreamSource::new(
            "x",
            io::Cursor::new(b"backup".to_vec()),
        )),
        &BackupOptions::default(),
    )
    .unwrap();
    let e = try_put(&o, &s, "team/db", "k", b"x".to_vec(), Encoding::Identity).unwrap_err();
    assert_eq!(e.code(), "not_a_bucket");
    assert_eq!(check_key("").unwrap_err().code(), "bad_key");
    assert_eq!(check_key("a\nb").unwrap_err().code(), "bad_key");
    assert_eq!(check_key(&"k".repeat(1025)).unwrap_err().code(), "bad_key");

    // A crash between removing an entry and expiring its version leaves an orphan.
    let b = "velero/bsl";
    put(&o, &s, b, "keep", b"keep".to_vec(), Encoding::Identity);
    let r = put(&o, &s, b, "orphan", b"orphan".to_vec(), Encoding::Identity);
    let mut batch = s.meta().batch();
    batch.delete(CF, &object_key(b, "orphan"));
    s.meta().write(batch, true).unwrap();
    assert_eq!(o.sweep(&s, b).unwrap(), [r.object.record.version]);
    let series = s.series(b).unwrap();
    assert_eq!(s.versions(&series).unwrap().len(), 1);
    assert_eq!(get(&s, b, "keep", false), b"keep");

    // A whole bucket deleted through its series leaves nothing listed.
    let newest = s.versions(&series).unwrap().last().unwrap().number;
    expire(&s, b, &ExpireSel::Version(newest)).unwrap();
    assert!(list(&s, b, "", None, None, 10).unwrap().objects.is_empty());
    o.forget_bucket(&s, b).unwrap();
    assert!(!is_bucket(s.meta(), b).unwrap());
}
