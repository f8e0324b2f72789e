//! Entry points for the fuzz targets in `worker/fuzz`, and the seeds they
//! start from (docs/fuzzing.md). Not an API: nothing outside the fuzz crate
//! and its regression test should call these.
//!
//! Each target hands arbitrary bytes to a decoder the way the engine meets
//! them. Where a real record wraps the decoded part in a checksum (a CRC32C
//! seal, a container's header and trailer) or in compression, the target
//! adds that wrapping itself, so the fuzzer spends its time in the decoding
//! and not in front of the checksum that guards it. A target returns whether
//! its input decoded; errors are the expected answer to most inputs. It
//! panics only when a decoder breaks a promise: a round trip that changes
//! what was decoded, or a tar member that escapes its tree.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::format::catalog::{self, Kind};
use crate::format::codec::{open_crc, seal_crc};
use crate::format::container::{self, ContainerFile, ContainerId};
use crate::format::recipe::{self, RecipeBuilder};
use crate::format::records::{RecipeForm, VersionKind, VersionRecord};
use crate::format::{keys, records, refcounts, unit};
use crate::meta::MetaRead;
use crate::restore::transfer::{Destination, Receiver};
use crate::source::tar::TarSource;
use crate::source::Source;

/// The fuzz targets, as named in `worker/fuzz/fuzz_targets` and
/// `worker/fuzz/regressions`.
pub const TARGETS: &[&str] = &[
    "tar_source",
    "catalog",
    "recipe",
    "container",
    "records",
    "transfer",
];

/// Runs target `target` on `data`: true when the input decoded.
pub fn run(target: &str, data: &[u8]) -> bool {
    match target {
        "tar_source" => tar_source(data),
        "catalog" => catalog(data),
        "recipe" => recipe(data),
        "container" => container(data),
        "records" => records(data),
        "transfer" => transfer(data),
        other => panic!("no fuzz target {other:?}; the targets are {TARGETS:?}"),
    }
}

/// `buf` with the CRC32C seal every stored record carries.
fn sealed(buf: &[u8]) -> Vec<u8> {
    let mut v = buf.to_vec();
    seal_crc(&mut v);
    v
}

/// A tar stream read as `revault backup --tar` and the server's tree upload
/// read it: every member's data to the end, then the catalog.
pub fn tar_source(data: &[u8]) -> bool {
    let mut src = TarSource::new("fuzz input", data);
    let mut buf = [0u8; 4096];
    loop {
        match src.next_piece() {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) => return false,
        }
        loop {
            match src.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }
    let Ok(Some(entries)) = Box::new(src).finish() else {
        return false;
    };
    for e in &entries {
        assert!(inside(&e.path), "member path {:?} escapes", e.path_str());
        if e.kind == Kind::Hardlink {
            assert!(inside(&e.link), "hard link target {:?} escapes", e.link);
        }
    }
    let back = catalog::decode("fuzz input", &catalog::encode(&entries))
        .expect("the catalog of a tar stream decodes");
    assert_eq!(back, entries, "the catalog of a tar stream round-trips");
    true
}

/// A relative path without empty, `.` or `..` components ("" is the root).
fn inside(p: &[u8]) -> bool {
    p.is_empty()
        || p.split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// A catalog. The first byte picks what the rest is: 0, the decoded entry
/// encoding (compressed and sealed here); 1, a zstd frame (sealed here);
/// 2, the stored parts as they are.
pub fn catalog(data: &[u8]) -> bool {
    let Some((&mode, body)) = data.split_first() else {
        return false;
    };
    let parts = match mode % 3 {
        0 => vec![sealed(
            &zstd::bulk::compress(body, 1).expect("zstd compresses in memory"),
        )],
        1 => vec![sealed(body)],
        _ => vec![body.to_vec()],
    };
    let Ok(entries) = catalog::decode("fuzz input", &parts) else {
        return false;
    };
    let back = catalog::decode("fuzz input", &catalog::encode(&entries))
        .expect("an encoded catalog decodes");
    assert_eq!(back, entries, "a decoded catalog round-trips");
    true
}

/// A recipe. An even first byte: the rest is one part's encoding (sealed
/// here), decoded and rebuilt. An odd one: the rest is a small store's
/// records (see [`recipe_store`]) whose version 1 is resolved into extents
/// as a restore does, through the live or archival reader.
pub fn recipe(data: &[u8]) -> bool {
    let Some((&mode, rest)) = data.split_first() else {
        return false;
    };
    if mode & 1 == 0 {
        recipe_part(rest)
    } else {
        recipe_resolve(mode, rest)
    }
}

fn recipe_part(body: &[u8]) -> bool {
    let Ok(entries) = recipe::decode_part("fuzz input", &sealed(body)) else {
        return false;
    };
    // Rebuilt, adjacent entries merge into runs; rebuilt again, nothing changes.
    let once = rebuild(&entries);
    assert_eq!(rebuild(&once), once, "a rebuilt recipe round-trips");
    assert_eq!(
        positions(&once),
        positions(&entries),
        "rebuilding a recipe keeps its positions"
    );
    true
}

fn rebuild(entries: &[recipe::Entry]) -> Vec<recipe::Entry> {
    let mut b = RecipeBuilder::new();
    entries.iter().for_each(|e| b.push(*e));
    b.finish()
        .iter()
        .flat_map(|p| recipe::decode_part("rebuilt", p).expect("a built recipe decodes"))
        .collect()
}

/// Runs of each kind an entry list covers, kind by kind.
fn positions(entries: &[recipe::Entry]) -> [u128; 4] {
    let mut n = [0u128; 4];
    for e in entries {
        let (k, c) = match *e {
            recipe::Entry::Units { count, .. } => (0, count),
            recipe::Entry::Zero { count, .. } => (1, count),
            recipe::Entry::Direct { count, .. } => (2, u64::from(count)),
            recipe::Entry::Indirect { count, .. } => (3, count),
        };
        n[k] += u128::from(c);
    }
    n
}

/// Metadata held in memory: what [`MetaRead`] reads, without a database.
#[derive(Default)]
struct MemMeta(BTreeMap<(&'static str, Vec<u8>), Vec<u8>>);

impl MetaRead for MemMeta {
    fn get_raw(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let cf = meta_cf(cf);
        Ok(self.0.get(&(cf, key.to_vec())).cloned())
    }

    fn multi_get_raw(&self, cf: &str, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get_raw(cf, k)).collect()
    }

    fn scan(&self, cf: &str, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let cf = meta_cf(cf);
        Ok(self
            .0
            .range((cf, prefix.to_vec())..)
            .take_while(|((c, k), _)| *c == cf && k.starts_with(prefix))
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect())
    }
}

fn meta_cf(cf: &str) -> &'static str {
    [
        keys::CF_SERIES,
        keys::CF_VERSIONS,
        keys::CF_RECIPES,
        keys::CF_UNITS,
        "default",
    ]
    .into_iter()
    .find(|c| *c == cf)
    .unwrap_or("other")
}

/// Positions a fuzzed version claims: the bound a restore holds its recipe to.
const FUZZ_CHUNKS: u64 = 4096;

fn fuzz_series() -> records::SeriesRecord {
    serde_json::from_str(
        r#"{"id":1,"name":"fuzz/s","unit":"segment","created_unix":0,"next_version":3}"#,
    )
    .expect("a series record parses")
}

fn fuzz_version(number: u32, form: RecipeForm) -> VersionRecord {
    VersionRecord {
        number,
        time_unix: 0,
        kind: VersionKind::Stream,
        form,
        logical_bytes: 0,
        chunks: FUZZ_CHUNKS,
        recipe_parts: 1,
        recipe_bytes: 0,
        catalog_parts: 0,
        catalog_bytes: 0,
        catalog_entries: 0,
        new_units: 0,
        new_vbytes: 0,
        new_container_bytes: 0,
        zero_bytes: 0,
        backup_secs: 0.0,
    }
}

/// Splits `data` into sections, each a u16 LE length and that many bytes
/// (the last one cut short when the input ends).
fn sections(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while data.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([data[0], data[1]])).min(data.len() - 2);
        out.push(&data[2..2 + n]);
        data = &data[2 + n..];
    }
    out
}

/// The inverse of [`sections`].
fn join_sections(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        let n = u16::try_from(p.len()).expect("a seed section fits in 64 KiB");
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// The store a recipe input describes: sections are version 1's recipe
/// part, version 2's (the newer version archival recipes point into), then
/// the records of units 0, 1, 2, ... (sealed here; an empty one is a unit
/// that does not exist). Bits 1 and 2 of `mode` make versions 1 and 2
/// archival.
fn recipe_store(mode: u8, data: &[u8]) -> MemMeta {
    let s = fuzz_series();
    let mut m = MemMeta::default();
    let mut put = |cf: &'static str, k: &[u8], v: Vec<u8>| m.0.insert((cf, k.to_vec()), v);
    put(
        keys::CF_SERIES,
        s.name.as_bytes(),
        serde_json::to_vec(&s).expect("a series serialises"),
    );
    let secs = sections(data);
    for (i, n) in [1u32, 2].into_iter().enumerate() {
        let form = if mode & (2 << i) != 0 {
            RecipeForm::Archival
        } else {
            RecipeForm::Live
        };
        let v = fuzz_version(n, form);
        put(
            keys::CF_VERSIONS,
            &keys::version_key(s.id, n),
            serde_json::to_vec(&v).expect("a version serialises"),
        );
        if let Some(part) = secs.get(i) {
            put(keys::CF_RECIPES, &keys::part_key(s.id, n, 0), sealed(part));
        }
    }
    for (id, rec) in secs.iter().skip(2).enumerate() {
        if !rec.is_empty() {
            put(keys::CF_UNITS, &(id as u64).to_be_bytes(), sealed(rec));
        }
    }
    m
}

fn recipe_resolve(mode: u8, data: &[u8]) -> bool {
    let m = recipe_store(mode, data);
    let s = fuzz_series();
    let Ok(Some(v)) = m.version(&s, 1) else {
        return false;
    };
    let Ok((mut ex, _)) = crate::recipe::version_extents(&m, &s, &v) else {
        return false;
    };
    let mut carry = None;
    loop {
        match crate::restore::faa::take_window(&m, &mut ex, &mut carry, 1 << 20) {
            Ok(w) if w.is_empty() => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
}

/// Where the container target writes its files: one directory per process.
fn scratch_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("revault-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create the fuzz scratch directory");
        d
    })
}

/// Bytes before the container file in a container input: flags, two data
/// ranges (vaddr u64, len u32) for `read_range` and a block range (two u32)
/// for `read_blocks`.
const CONTAINER_OPS: usize = 1 + 2 * 12 + 8;

/// Larger reads are cut to this: the reader's buffer is the caller's.
const MAX_READ: u32 = 1 << 20;

/// A container file, opened and read. Flags bit 0: reseal the file (header,
/// block and footer checksums, trailer) so that a mutated container passes
/// its checksums; bit 1: decode the footer's unit table too.
pub fn container(data: &[u8]) -> bool {
    if data.len() < CONTAINER_OPS {
        return false;
    }
    let (ops, file) = data.split_at(CONTAINER_OPS);
    let mut file = file.to_vec();
    let id = ContainerId(
        file.get(8..16)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes"))),
    );
    if ops[0] & 1 != 0 {
        reseal(id, &mut file);
    }
    let dir = scratch_dir();
    let path = id.path(dir);
    std::fs::create_dir_all(path.parent().expect("a container has a directory"))
        .expect("create a container directory");
    std::fs::write(&path, &file).expect("write the fuzzed container");
    let ok = read_container(dir, id, ops);
    let _ = std::fs::remove_file(&path);
    ok
}

/// Makes the checksums of a (mutated) container file match its bytes: the
/// header's, the trailer's container id and footer checksum, and, when the
/// footer decodes, every block's checksum within the file.
fn reseal(id: ContainerId, file: &mut Vec<u8>) {
    let (head, trail) = (
        container::HEADER_LEN as usize,
        container::TRAILER_LEN as usize,
    );
    if file.len() < head + trail {
        return;
    }
    let crc = crc32c::crc32c(&file[..head - 4]);
    file[head - 4..head].copy_from_slice(&crc.to_le_bytes());
    let t = file.len() - trail;
    file[t + 16..t + 24].copy_from_slice(&id.0.to_le_bytes());
    let foff = u64::from_le_bytes(file[t..t + 8].try_into().expect("8 bytes"));
    let flen = u32::from_le_bytes(file[t + 8..t + 12].try_into().expect("4 bytes"));
    let Some(foff) = usize::try_from(foff)
        .ok()
        .filter(|&o| o >= head && o.checked_add(flen as usize) == Some(t))
    else {
        return;
    };
    let mut footer = file[foff..t].to_vec();
    if let Ok(mut f) = container::decode_footer(id, &footer, true) {
        for b in &mut f.blocks {
            let (at, n) = (b.offset as usize, b.stored_len as usize);
            if let Some(stored) = at
                .checked_add(n)
                .filter(|&e| e <= foff)
                .map(|e| &file[at..e])
            {
                b.crc = crc32c::crc32c(stored);
            }
        }
        footer = container::encode_footer(&f);
    }
    let mut trailer = file[t..].to_vec();
    trailer[8..12].copy_from_slice(&(footer.len() as u32).to_le_bytes());
    trailer[12..16].copy_from_slice(&crc32c::crc32c(&footer).to_le_bytes());
    file.truncate(foff);
    file.extend_from_slice(&footer);
    file.extend_from_slice(&trailer);
}

fn read_container(dir: &Path, id: ContainerId, ops: &[u8]) -> bool {
    let u32_at = |i: usize| u32::from_le_bytes(ops[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(ops[i..i + 8].try_into().expect("8 bytes"));
    let Ok(c) = ContainerFile::open(dir, id, ops[0] & 2 != 0) else {
        return false;
    };
    let mut ok = true;
    for at in [1, 13] {
        let mut out = vec![0u8; (u32_at(at + 8) % MAX_READ) as usize];
        ok &= c.read_range(u64_at(at), &mut out).is_ok();
    }
    let n = c.footer.blocks.len() + 1;
    let (a, b) = (u32_at(25) as usize % n, u32_at(29) as usize % n);
    let mut buf = Vec::new();
    ok &= c.read_blocks(a.min(b)..a.max(b), &mut buf).is_ok();
    // `read_all` holds the whole data space; a container is at most a few MiB.
    if c.footer.vbytes <= 64 << 20 {
        ok &= c.read_all().is_ok();
    }
    ok
}

/// A metadata record. The first byte picks the decoder; the rest is the
/// record's body, sealed here where the record is sealed: 0, a unit; 1, a
/// container record; 2, a block of reference counts (its block number,
/// u64 LE, first); 3, one unit's counts (unsealed); 4, an index entry's
/// copies (unsealed); 5, the id counters.
pub fn records(data: &[u8]) -> bool {
    let Some((&kind, body)) = data.split_first() else {
        return false;
    };
    match kind % 6 {
        0 => match unit::UnitRecord::decode(7, &sealed(body)) {
            Ok(u) => {
                let back = unit::UnitRecord::decode(7, &u.encode()).expect("an encoded unit");
                assert_eq!(back, u, "a unit record round-trips");
                true
            }
            Err(_) => false,
        },
        1 => match records::ContainerRecord::decode(ContainerId(7), &sealed(body)) {
            Ok(c) => {
                let back = records::ContainerRecord::decode(ContainerId(7), &c.encode())
                    .expect("an encoded container record");
                assert_eq!(back, c, "a container record round-trips");
                true
            }
            Err(_) => false,
        },
        2 => {
            let Some((block, body)) = body.split_first_chunk::<8>() else {
                return false;
            };
            let block = u64::from_le_bytes(*block);
            match refcounts::RefsBlock::decode(block, &sealed(body)) {
                Ok(b) => {
                    let back = refcounts::RefsBlock::decode(block, &b.encode()).expect("a block");
                    assert_eq!(back, b, "a block of counts round-trips");
                    b.units(block).count();
                    true
                }
                Err(_) => false,
            }
        }
        3 => refcounts::Refs::decode(7, body).is_ok(),
        4 => crate::index::decode_copies(body).is_some(),
        _ => match records::Counters::decode(&sealed(body)) {
            Ok(c) => {
                let back = records::Counters::decode(&c.encode()).expect("encoded counters");
                assert_eq!(back, c, "the id counters round-trip");
                true
            }
            Err(_) => false,
        },
    }
}

/// A block-transfer stream as `revault pull` receives it from a server,
/// into a tar or raw writer. The first byte sets the size of the pieces it
/// arrives in (times 64 bytes).
pub fn transfer(data: &[u8]) -> bool {
    let Some((&step, stream)) = data.split_first() else {
        return false;
    };
    let step = usize::from(step).max(1) * 64;
    let mut rx = Receiver::new(Destination::Writer(Box::new(std::io::sink())));
    for piece in stream.chunks(step) {
        if rx.feed(piece).is_err() {
            return false;
        }
    }
    rx.finish().is_ok()
}

/// Valid inputs of every target, made by the engine from small data: real
/// tar streams, catalogs, recipes, records, containers and transfer
/// streams, so that each target starts from real structures. Returns
/// (target, input) pairs.
pub fn seeds() -> Result<Vec<(&'static str, Vec<u8>)>> {
    let root = std::env::temp_dir().join(format!("revault-fuzz-seeds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let out = seeds_in(&root);
    let _ = std::fs::remove_dir_all(&root);
    out
}

fn seeds_in(root: &Path) -> Result<Vec<(&'static str, Vec<u8>)>> {
    use crate::config::{DedupUnit, SizeRange, StoreConfig, KIB, MIB};
    use crate::ingest::{backup, BackupOptions};
    use crate::source::StreamSource;
    use crate::store::{InitOptions, OpenMode, Store, VersionSel};

    let config = StoreConfig {
        chunk: SizeRange {
            min: 256,
            avg: 1024,
            max: 8 * 1024,
        },
        segment: SizeRange {
            min: 4 * KIB as u32,
            avg: 16 * KIB as u32,
            max: 64 * KIB as u32,
        },
        container_bytes: MIB,
        block_bytes: 64 * KIB as u32,
        ..Default::default()
    };
    Store::init(
        root,
        &InitOptions {
            config,
            data_dir: None,
        },
    )?;
    let store = Store::open(root, OpenMode::ReadWrite, "fuzz seeds")?;
    let mut out: Vec<(&'static str, Vec<u8>)> = Vec::new();

    // Streams: text-like data with a run of zeros and an edit, so that
    // blocks compress, zero chunks appear and version 2 dedups against 1.
    let mut v1: Vec<u8> = (0..150_000u32)
        .flat_map(|i| format!("line {} of the fuzz seed\n", i % 977).into_bytes())
        .take(150_000)
        .collect();
    v1.extend(std::iter::repeat_n(0u8, 20_000));
    let mut v2 = v1.clone();
    v2[40_000..40_100].fill(b'#');
    for (series, unit) in [
        ("fuzz/seg", DedupUnit::Segment),
        ("fuzz/chunk", DedupUnit::Chunk),
    ] {
        for data in [&v1, &v2] {
            let src = StreamSource::new("seed", std::io::Cursor::new(data.clone()));
            let opts = BackupOptions {
                unit: Some(unit),
                ..Default::default()
            };
            backup(&store, series, Box::new(src), &opts)?;
        }
    }
    // Slide makes version 1 of the segment series archival.
    crate::maintenance::slide::slide(&store, "fuzz/seg")?;

    let tars = seed_tars();
    for t in &tars {
        out.push(("tar_source", t.clone()));
    }
    let src = TarSource::new("seed", std::io::Cursor::new(tars[0].clone()));
    backup(
        &store,
        "fuzz/tree",
        Box::new(src),
        &BackupOptions::default(),
    )?;

    let m = store.meta();
    for (_, part) in m.scan_prefix(keys::CF_CATALOGS, b"")? {
        let packed = open_crc(&part).expect("a stored catalog part is sealed");
        let raw = zstd::stream::decode_all(packed).expect("a stored catalog decompresses");
        out.push(("catalog", [&[0u8][..], &raw].concat()));
        out.push(("catalog", [&[1u8][..], packed].concat()));
    }
    for (_, part) in m.scan_prefix(keys::CF_RECIPES, b"")? {
        let body = open_crc(&part).expect("a stored recipe part is sealed");
        out.push(("recipe", [&[0u8][..], body].concat()));
    }
    // Resolution inputs: each series' versions 1 and 2 with the units they name.
    let units: BTreeMap<u64, Vec<u8>> = m
        .scan_prefix(keys::CF_UNITS, b"")?
        .into_iter()
        .map(|(k, v)| {
            let id = u64::from_be_bytes(k[..8].try_into().expect("unit keys are 8 bytes"));
            (id, open_crc(&v).expect("a unit is sealed").to_vec())
        })
        .collect();
    for s in m.all_series()? {
        let mut secs = Vec::new();
        let mut mode = 1u8;
        for (i, n) in [1u32, 2].into_iter().enumerate() {
            let Some(v) = m.version(&s, n)? else { break };
            if v.form == RecipeForm::Archival {
                mode |= 2 << i;
            }
            let part = m
                .get(keys::CF_RECIPES, &keys::part_key(s.id, n, 0))?
                .expect("part 0 of a version");
            secs.push(open_crc(&part).expect("sealed").to_vec());
        }
        if secs.len() == 2 && units.keys().all(|&id| id < 512) {
            let top = units.keys().max().map_or(0, |&id| id + 1);
            secs.extend((0..top).map(|id| units.get(&id).cloned().unwrap_or_default()));
            out.push(("recipe", [&[mode][..], &join_sections(&secs)].concat()));
        }
    }
    for body in units.values() {
        out.push(("records", [&[0u8][..], body].concat()));
    }
    for (_, v) in m.scan_prefix(keys::CF_CONTAINERS, b"")? {
        out.push((
            "records",
            [&[1u8][..], open_crc(&v).expect("sealed")].concat(),
        ));
    }
    for (k, v) in m.scan_prefix(keys::CF_REFCOUNTS, b"")? {
        let block = u64::from_be_bytes(k[..8].try_into().expect("block keys are 8 bytes"));
        let body = open_crc(&v).expect("sealed");
        out.push(("records", [&[2u8][..], &block.to_le_bytes(), body].concat()));
    }
    for (_, v) in m
        .scan_prefix(keys::CF_INDEX, b"")
        .into_iter()
        .flatten()
        .take(8)
    {
        out.push(("records", [&[4u8][..], &v].concat()));
    }
    out.push((
        "records",
        [3u8, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0].to_vec(),
    ));
    if let Some(c) = m.get("default", keys::COUNTERS_KEY)? {
        out.push((
            "records",
            [&[5u8][..], open_crc(&c).expect("sealed")].concat(),
        ));
    }

    for entry in walk(store.data_dir()) {
        let file = std::fs::read(&entry).map_err(|e| crate::Error::Io {
            context: format!("reading {}", entry.display()),
            source: e,
        })?;
        if entry.extension().is_some_and(|e| e == "rvc") {
            // Two ranges inside the data: its start, and its second half.
            let id = ContainerId(u64::from_le_bytes(file[8..16].try_into().expect("8 bytes")));
            let vbytes = store.open_container(id, false)?.footer.vbytes;
            let half = u32::try_from(vbytes / 2).expect("a seed container is small");
            let mut ops = vec![3u8];
            ops.extend_from_slice(&0u64.to_le_bytes());
            ops.extend_from_slice(&half.min(4096).to_le_bytes());
            ops.extend_from_slice(&u64::from(half).to_le_bytes());
            ops.extend_from_slice(&half.to_le_bytes());
            ops.extend_from_slice(&0u32.to_le_bytes());
            ops.extend_from_slice(&u32::MAX.to_le_bytes());
            out.push(("container", [ops, file].concat()));
        }
    }

    for series in ["fuzz/seg", "fuzz/chunk", "fuzz/tree"] {
        let mut wire = Vec::new();
        let opts = crate::restore::RestoreOptions {
            cache_bytes: 64 * KIB,
            ..Default::default()
        };
        crate::restore::transfer::send(&store, series, VersionSel::Latest, &opts, &mut wire)?;
        out.push(("transfer", [&[16u8][..], &wire].concat()));
    }
    Ok(out)
}

/// Tar streams of a small tree: directories, files, a symlink, a hard link,
/// a long name (GNU) and PAX records.
fn seed_tars() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for pax in [false, true] {
        let mut b = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        dir.set_cksum();
        b.append_data(&mut dir.clone(), "top/", std::io::empty())
            .expect("append to a tar in memory");
        if pax {
            b.append_pax_extensions([("mtime", &b"1700000000.5"[..]), ("uid", b"1000")])
                .expect("append to a tar in memory");
        }
        let files: [(&str, Vec<u8>); 3] = [
            ("top/a.txt", b"hello, fuzz\n".repeat(40)),
            (
                "top/sub/b.bin",
                (0..3000u32).map(|i| (i % 251) as u8).collect(),
            ),
            (&format!("top/{}", "long".repeat(40)), b"long name".to_vec()),
        ];
        for (name, data) in &files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o640);
            h.set_mtime(1_700_000_000);
            h.set_cksum();
            b.append_data(&mut h, name, &data[..])
                .expect("append to a tar in memory");
        }
        let mut l = tar::Header::new_gnu();
        l.set_entry_type(tar::EntryType::Symlink);
        l.set_size(0);
        b.append_link(&mut l, "top/link", "a.txt")
            .expect("append to a tar in memory");
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Link);
        h.set_size(0);
        b.append_link(&mut h, "top/hard", "top/a.txt")
            .expect("append to a tar in memory");
        let mut t = b.into_inner().expect("finish a tar in memory");
        t.flush().expect("a Vec flushes");
        out.push(t);
    }
    out
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}
