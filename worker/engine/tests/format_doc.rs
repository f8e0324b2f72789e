//! docs/format.md lists every column family and every key the code writes: a family, a
//! default-family key or a key kind added without a line in the document fails here.

use revault_engine::{keys, ContainerId, DedupUnit, Fp};

/// The rows of format.md's "RocksDB column families" table: (family, key column).
fn rows() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/format.md"))
        .unwrap();
    let table = doc
        .split("## RocksDB column families")
        .nth(1)
        .expect("format.md has the column families section");
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_string(), cells[2].to_string())
        })
        .collect()
}

#[test]
fn every_column_family_is_documented_and_none_other() {
    let documented: std::collections::BTreeSet<String> = rows().into_iter().map(|r| r.0).collect();
    let code: std::collections::BTreeSet<String> = keys::ALL_CFS
        .iter()
        .map(|c| c.to_string())
        .chain(["default".to_string()])
        .collect();
    assert_eq!(documented, code);
}

#[test]
fn every_key_kind_is_documented() {
    let rows = rows();
    let has = |family: &str, key: &str| {
        rows.iter()
            .any(|(f, k)| f == family && k.starts_with(&format!("`{key}`")))
    };
    for key in keys::DEFAULT_KEYS {
        let key = std::str::from_utf8(key).unwrap();
        assert!(
            has("default", key),
            "format.md has no `default` row for {key:?}"
        );
    }
    let c = ContainerId(7);
    for first in [
        keys::mark_key(1, 2)[0],
        keys::member_key(2, 1)[0],
        keys::group_key(2)[0],
        keys::sweep_key(c)[0],
        keys::freed_key(c)[0],
        keys::zombie_key(1)[0],
    ] {
        let kind = (first as char).to_string();
        assert!(
            has("marks", &kind),
            "format.md has no `marks` row for kind {kind}"
        );
    }
    for unit in [DedupUnit::Segment, DedupUnit::Chunk] {
        let kind = (keys::index_key(unit, &Fp([0; 32]))[0] as char).to_string();
        let index = rows
            .iter()
            .find(|(f, _)| f == "index")
            .expect("an index row");
        assert!(
            index.1.contains(&format!("`{kind}`")),
            "the index row does not name kind {kind}"
        );
    }
}
