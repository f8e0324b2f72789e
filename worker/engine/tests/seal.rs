//! A series sealed as moved to another worker takes no new version; the seal waits for a
//! backup in progress (it cannot slip between a backup's start and its commit).

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use revault_engine::{set_moved_to, DedupUnit, Error, OpenMode, Store};

#[test]
fn a_moved_series_refuses_backups_until_unsealed_and_keeps_its_versions() {
    let (dir, st) = new_store(small_config());
    let v1 = random(1 << 20, 1);
    backup_bytes(&st, "team/db", &v1, DedupUnit::Segment);
    let s = set_moved_to(&st, "team/db", Some("https://w2:8420".into())).unwrap();
    assert_eq!(s.moved_to.as_deref(), Some("https://w2:8420"));
    let src =
        revault_engine::StreamSource::new("test input", std::io::Cursor::new(random(1000, 2)));
    let e = revault_engine::backup(&st, "team/db", Box::new(src), &Default::default()).unwrap_err();
    assert!(matches!(e, Error::SeriesMoved { .. }), "{e}");
    assert!(e.to_string().contains("moved to https://w2:8420"), "{e}");
    assert!(
        restore_bytes(&st, "team/db", 1).0 == v1,
        "version 1 still restores"
    );
    // Reopened, the seal holds.
    drop(st);
    let st = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
    let src =
        revault_engine::StreamSource::new("test input", std::io::Cursor::new(random(1000, 2)));
    assert!(revault_engine::backup(&st, "team/db", Box::new(src), &Default::default()).is_err());
    set_moved_to(&st, "team/db", None).unwrap();
    let rep = backup_bytes(&st, "team/db", &random(1000, 3), DedupUnit::Segment);
    assert_eq!(rep.version, 2);
    assert!(matches!(
        set_moved_to(&st, "team/none", Some("x".into())),
        Err(Error::UnknownSeries(_))
    ));
    for bad in [
        " ".to_string(),
        "x".repeat(1025),
        "https://w2\n".to_string(),
    ] {
        assert!(
            matches!(
                set_moved_to(&st, "team/db", Some(bad.clone())),
                Err(Error::Invalid(_))
            ),
            "{bad:?}"
        );
    }
    assert!(set_moved_to(&st, "team/db", Some("x".repeat(1024))).is_ok());
}

#[test]
fn the_seal_waits_for_a_backup_in_progress() {
    let (_d, st) = new_store(small_config());
    backup_bytes(&st, "team/db", &random(1 << 20, 4), DedupUnit::Segment);
    let seen = Arc::new(Mutex::new(None));
    let seen2 = seen.clone();
    st.on_pause_point(
        "backup.before_commit",
        Box::new(move |st: &Store| {
            let r = set_moved_to(st, "team/db", Some("https://w2:8420".into()));
            *seen2.lock().unwrap() = Some(r.map(|_| ()).map_err(|e| e.to_string()));
        }),
    );
    let rep = backup_bytes(&st, "team/db", &random(1 << 20, 5), DedupUnit::Segment);
    assert_eq!(rep.version, 2, "the backup that was running commits");
    let r = seen.lock().unwrap().take().expect("the pause point ran");
    assert!(
        r.as_ref()
            .is_err_and(|e| e.contains("already has a backup in progress")),
        "{r:?}"
    );
    assert!(st.series("team/db").unwrap().moved_to.is_none());
}
