//! A flipped byte in a container or a recipe makes restore and check fail with
//! an error naming the container or version; never wrong bytes.

mod common;

use common::*;
use revault_engine::{
    keys::{part_key, CF_RECIPES},
    restore, DedupUnit, RestoreOptions, RestoreTarget, StoreConfig, VersionSel,
};

fn container_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(dir.join("data")).unwrap() {
        for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
            out.push(f.unwrap().path());
        }
    }
    out.sort();
    out
}

fn try_restore(store: &revault_engine::Store, series: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    restore(
        store,
        series,
        VersionSel::Latest,
        &RestoreOptions::default(),
        RestoreTarget::Writer(&mut out),
    )
    .map(|_| out)
    .map_err(|e| e.to_string())
}

#[test]
fn a_flipped_container_byte_is_reported_never_served() {
    for unit in [DedupUnit::Segment, DedupUnit::Chunk] {
        let (dir, store) = new_store(StoreConfig::default());
        let data = random(3 << 20, 1);
        backup_bytes(&store, "default/db", &data, unit);
        let files = container_files(dir.path());
        let victim = &files[0];
        let mut bytes = std::fs::read(victim).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x20;
        std::fs::write(victim, &bytes).unwrap();
        let name = format!(
            "{}/{}",
            victim
                .parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap(),
            victim.file_stem().unwrap().to_str().unwrap()
        );
        let err = try_restore(&store, "default/db").unwrap_err();
        assert!(
            err.contains("corrupt container") && err.contains(&name),
            "{unit}: {err}"
        );
        let rep = revault_engine::check(&store).unwrap();
        assert!(!rep.ok);
        assert!(
            rep.errors.iter().any(|e| e.contains(&name)),
            "{:?}",
            rep.errors
        );
    }
}

#[test]
fn a_flipped_recipe_byte_is_reported_with_the_version() {
    let (_dir, store) = new_store(small_config());
    let data = random(500_000, 2);
    backup_bytes(&store, "default/db", &data, DedupUnit::Chunk);
    let s = store.series("default/db").unwrap();
    let key = part_key(s.id, 1, 0);
    let meta = store.meta();
    let mut v = meta.get(CF_RECIPES, &key).unwrap().unwrap();
    v[3] ^= 0x01;
    let mut b = meta.batch();
    b.put(CF_RECIPES, &key, &v);
    meta.write(b, true).unwrap();
    let err = try_restore(&store, "default/db").unwrap_err();
    assert!(err.contains("recipe of default/db version 1"), "{err}");
    let rep = revault_engine::check(&store).unwrap();
    assert!(
        rep.errors
            .iter()
            .any(|e| e.contains("default/db version 1")),
        "{:?}",
        rep.errors
    );
}

#[test]
fn a_missing_container_is_reported() {
    let (dir, store) = new_store(StoreConfig::default());
    backup_bytes(
        &store,
        "default/db",
        &random(1 << 20, 3),
        DedupUnit::Segment,
    );
    for f in container_files(dir.path()) {
        std::fs::remove_file(f).unwrap();
    }
    let err = try_restore(&store, "default/db").unwrap_err();
    assert!(err.contains("missing from the data directory"), "{err}");
}
