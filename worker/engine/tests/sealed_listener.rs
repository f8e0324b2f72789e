//! `Store::on_container_sealed`: the durable tier uploads containers as they are sealed, so
//! the listener must hear of every container a session writes, each only once its file is
//! whole (its trailer written), and of a failed session's containers too.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use revault_engine::{ContainerId, DedupUnit};

/// The ids heard, and whether each file ended with the container trailer when heard.
type Heard = Arc<Mutex<Vec<(ContainerId, bool)>>>;

fn listen(st: &revault_engine::Store) -> Heard {
    let heard: Heard = Arc::default();
    let (h, data) = (heard.clone(), st.data_dir().to_path_buf());
    st.on_container_sealed(Arc::new(move |id| {
        let whole = std::fs::read(id.path(&data)).is_ok_and(|b| b.ends_with(b"RVLTEND1"));
        h.lock().unwrap().push((id, whole));
    }));
    heard
}

#[test]
fn every_sealed_container_is_heard_once_whole() {
    let (dir, st) = new_store(small_config());
    let heard = listen(&st);
    // 5 MiB of random data in 1 MiB containers: several sealed during the backup.
    backup_bytes(&st, "team/db", &random(5 << 20, 1), DedupUnit::Segment);
    let heard = heard.lock().unwrap().clone();
    assert!(heard.len() >= 5, "{heard:?}");
    assert!(
        heard.iter().all(|(_, whole)| *whole),
        "a container was heard before its file was whole: {heard:?}"
    );
    let mut ids: Vec<ContainerId> = heard.iter().map(|(id, _)| *id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), heard.len(), "a container was heard twice");
    assert_eq!(
        files_in(&dir.path().join("data")),
        ids.len() as u64,
        "the listener heard of exactly the containers the backup committed"
    );
}

#[test]
fn a_failed_backups_containers_are_heard_too() {
    let (_dir, st) = new_store(small_config());
    let heard = listen(&st);
    // A source that fails after 8 MiB: containers were sealed, nothing is committed.
    struct Failing(std::io::Cursor<Vec<u8>>);
    impl std::io::Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match self.0.read(buf)? {
                0 => Err(std::io::Error::other("the disk went away")),
                n => Ok(n),
            }
        }
    }
    let src = revault_engine::StreamSource::new(
        "failing input",
        Failing(std::io::Cursor::new(random(8 << 20, 2))),
    );
    let e = revault_engine::backup(&st, "team/db", Box::new(src), &Default::default());
    assert!(e.is_err(), "the backup fails");
    assert!(
        !heard.lock().unwrap().is_empty(),
        "containers sealed before the failure were heard (a listener may have uploaded them)"
    );
    assert!(
        st.list_series().unwrap().is_empty(),
        "nothing was committed"
    );
}
