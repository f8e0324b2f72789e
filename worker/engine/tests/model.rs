//! Model-based test of reverse dedup, retention and gc (proptest state machine).
//!
//! Three series share content (pastes across series, both dedup units; edits
//! insert, delete, overwrite, repeat and reorder) and have different live
//! windows. Operations: backup, slide, expire (oldest, a middle version, any
//! version, by time), gc (incremental and full, with compaction thresholds
//! from 0.1 to 1), a crash at a failpoint followed by a reopen, and
//! restores. After every step: every version the model holds restores
//! byte-exact, the store lists exactly the model's versions in the right
//! form, and `check` (checksums, reference counts, container counts, every
//! recipe resolving) passes. At the end every version is deleted and gc
//! leaves zero containers and zero bytes.

mod common;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use revault_engine::{
    backup, expire, gc, slide, BackupOptions, DedupUnit, ExpireSel, GcOptions, MetaRead, OpenMode,
    RecipeForm, Retention, Store, StreamSource,
};

const SERIES: [&str; 3] = ["team-a/db", "team-a/files", "team-b/db"];
const UNITS: [DedupUnit; 3] = [DedupUnit::Segment, DedupUnit::Chunk, DedupUnit::Segment];
const LIVE: [u32; 3] = [1, 1, 2];
const DAY: i64 = 86_400;

#[derive(Clone, Debug)]
enum Edit {
    Insert {
        at: f64,
        len: usize,
        seed: u64,
    },
    Delete {
        at: f64,
        len: usize,
    },
    Overwrite {
        at: f64,
        len: usize,
        seed: u64,
    },
    Zeros {
        at: f64,
        len: usize,
    },
    /// Paste a region of another series' current content: cross-series sharing.
    Paste {
        from: usize,
        at: f64,
        len: usize,
    },
    /// Repeat a region a little after itself: chunks repeated inside one
    /// segment (linked inside their unit) or in the next few.
    Echo {
        at: f64,
        len: usize,
        gap: usize,
    },
    /// Swap what lies before and after a point (files reordered in a tar):
    /// later versions meet earlier segments in another order.
    Rotate {
        at: f64,
    },
}

#[derive(Clone, Debug)]
enum Which {
    Oldest,
    Middle,
    Newest,
    /// Every version older than the n-th (from the oldest); the newest stays.
    BeforeNth(usize),
}

#[derive(Clone, Debug)]
enum Op {
    Backup {
        s: usize,
        edits: Vec<Edit>,
    },
    Slide {
        s: usize,
    },
    Expire {
        s: usize,
        which: Which,
    },
    Gc {
        full: bool,
        compact_below: f64,
    },
    /// The operation stops at the failpoint as if the process were killed there;
    /// the store is then reopened (recovery).
    Crash {
        op: Box<Op>,
        point: &'static str,
    },
    Restore {
        s: usize,
        idx: usize,
    },
}

#[derive(Clone)]
struct Version {
    number: u32,
    time: i64,
    live: bool,
    content: Arc<Vec<u8>>,
}

impl std::fmt::Debug for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "v{}({} bytes, {})",
            self.number,
            self.content.len(),
            if self.live { "live" } else { "archival" }
        )
    }
}

#[derive(Clone)]
struct SeriesModel {
    current: Vec<u8>,
    versions: Vec<Version>,
    next: u32,
}

/// Shrunk failures print sizes, not megabytes of content.
impl std::fmt::Debug for SeriesModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{{current: {} bytes, versions: {:?}}}",
            self.current.len(),
            self.versions
        )
    }
}

#[derive(Clone, Debug)]
struct Model {
    series: Vec<SeriesModel>,
    clock: i64,
}

fn apply_edit(model: &Model, data: &mut Vec<u8>, e: &Edit) {
    let pos = |f: f64, d: &Vec<u8>| ((d.len() as f64) * f) as usize;
    match *e {
        Edit::Insert { at, len, seed } => {
            let p = pos(at, data);
            data.splice(p..p, random(len, seed));
        }
        Edit::Delete { at, len } => {
            let p = pos(at, data);
            let end = (p + len).min(data.len());
            data.drain(p..end);
        }
        Edit::Overwrite { at, len, seed } => {
            let p = pos(at, data);
            let end = (p + len).min(data.len());
            data.splice(p..end, random(end - p, seed));
        }
        Edit::Zeros { at, len } => {
            let p = pos(at, data);
            data.splice(p..p, std::iter::repeat_n(0u8, len));
        }
        Edit::Paste { from, at, len } => {
            let src = &model.series[from].current;
            let a = pos(at, src);
            let piece = src[a..(a + len).min(src.len())].to_vec();
            let p = data.len() / 2;
            data.splice(p..p, piece);
        }
        Edit::Echo { at, len, gap } => {
            let p = pos(at, data);
            let piece = data[p..(p + len).min(data.len())].to_vec();
            let q = (p + piece.len() + gap).min(data.len());
            data.splice(q..q, piece);
        }
        Edit::Rotate { at } => {
            let p = pos(at, data);
            data.rotate_left(p);
        }
    }
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (0.0..1.0f64, 1usize..6_000, any::<u64>()).prop_map(|(at, len, seed)| Edit::Insert { at, len, seed }),
        2 => (0.0..1.0f64, 1usize..8_000).prop_map(|(at, len)| Edit::Delete { at, len }),
        3 => (0.0..1.0f64, 1usize..6_000, any::<u64>()).prop_map(|(at, len, seed)| Edit::Overwrite { at, len, seed }),
        1 => (0.0..1.0f64, 1usize..40_000).prop_map(|(at, len)| Edit::Zeros { at, len }),
        2 => (0usize..3, 0.0..1.0f64, 1usize..60_000).prop_map(|(from, at, len)| Edit::Paste { from, at, len }),
        2 => (0.0..1.0f64, 1usize..6_000, 0usize..3_000).prop_map(|(at, len, gap)| Edit::Echo { at, len, gap }),
        1 => (0.0..1.0f64).prop_map(|at| Edit::Rotate { at }),
    ]
}

/// gc, incremental or full, compacting containers below a live fraction
/// from "almost never" to "always" (operators tune it; every value must be
/// safe).
fn gc_op() -> impl Strategy<Value = Op> {
    (
        any::<bool>(),
        proptest::sample::select(&[0.1, 0.5, 0.9, 1.0][..]),
    )
        .prop_map(|(full, compact_below)| Op::Gc {
            full,
            compact_below,
        })
}

/// Versions that would leave the live window, oldest first.
fn leaving(s: &SeriesModel, live: u32) -> Vec<usize> {
    let lives: Vec<usize> = (0..s.versions.len())
        .filter(|&i| s.versions[i].live)
        .collect();
    lives[..lives.len().saturating_sub(live as usize)].to_vec()
}

fn doomed(s: &SeriesModel, which: &Which) -> Vec<u32> {
    let n = s.versions.len();
    match *which {
        Which::Oldest => s
            .versions
            .first()
            .map(|v| vec![v.number])
            .unwrap_or_default(),
        Which::Newest => s
            .versions
            .last()
            .map(|v| vec![v.number])
            .unwrap_or_default(),
        Which::Middle => {
            if n >= 3 {
                vec![s.versions[n / 2].number]
            } else {
                vec![]
            }
        }
        Which::BeforeNth(k) => {
            if n == 0 {
                return vec![];
            }
            let cut = s.versions[k.min(n - 1)].time;
            s.versions[..n - 1]
                .iter()
                .filter(|v| v.time < cut)
                .map(|v| v.number)
                .collect()
        }
    }
}

struct StoreModel;

impl ReferenceStateMachine for StoreModel {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        (20_000usize..120_000, any::<u64>())
            .prop_map(|(len, seed)| {
                // All series start from one base: shared segments and chunks.
                let base = random(len, seed);
                Model {
                    series: (0..3)
                        .map(|_| SeriesModel {
                            current: base.clone(),
                            versions: vec![],
                            next: 1,
                        })
                        .collect(),
                    clock: 1_700_000_000,
                }
            })
            .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Op> {
        let backup = || {
            (0usize..3, proptest::collection::vec(edit(), 0..4))
                .prop_map(|(s, edits)| Op::Backup { s, edits })
        };
        let which = prop_oneof![
            3 => Just(Which::Oldest),
            2 => Just(Which::Middle),
            1 => Just(Which::Newest),
            1 => (0usize..6).prop_map(Which::BeforeNth),
        ];
        let has_versions = state.series.iter().any(|s| !s.versions.is_empty());
        let mut ops = vec![(6, backup().boxed())];
        if has_versions {
            ops.push((3, (0usize..3).prop_map(|s| Op::Slide { s }).boxed()));
            ops.push((
                3,
                (0usize..3, which.clone())
                    .prop_map(|(s, which)| Op::Expire { s, which })
                    .boxed(),
            ));
            ops.push((2, gc_op().boxed()));
            ops.push((
                2,
                (0usize..3, 0usize..8)
                    .prop_map(|(s, idx)| Op::Restore { s, idx })
                    .boxed(),
            ));
            let sel = |pts: &'static [&'static str]| proptest::sample::select(pts);
            let crashing = prop_oneof![
                (
                    backup(),
                    sel(&[
                        "backup.before_commit",
                        "commit.before_write",
                        "commit.before_unlink"
                    ])
                )
                    .prop_map(|(b, p)| (b, p)),
                (
                    0usize..3,
                    sel(&[
                        "slide.before_commit",
                        "commit.before_write",
                        "commit.before_unlink"
                    ])
                )
                    .prop_map(|(s, p)| (Op::Slide { s }, p)),
                (
                    0usize..3,
                    which.clone(),
                    sel(&["expire.before_commit", "commit.before_unlink"])
                )
                    .prop_map(|(s, which, p)| (Op::Expire { s, which }, p)),
                (
                    gc_op(),
                    sel(&[
                        "gc.before_mark_commit",
                        "gc.before_sweep_commit",
                        "commit.before_unlink"
                    ])
                ),
            ];
            ops.push((
                2,
                crashing
                    .prop_map(|(op, point)| Op::Crash {
                        op: Box::new(op),
                        point,
                    })
                    .boxed(),
            ));
        } else {
            ops.push((
                1,
                (backup(), Just("backup.before_commit"))
                    .prop_map(|(b, point)| Op::Crash {
                        op: Box::new(b),
                        point,
                    })
                    .boxed(),
            ));
        }
        proptest::strategy::Union::new_weighted(ops).boxed()
    }

    fn apply(mut m: Model, op: &Op) -> Model {
        match op {
            Op::Backup { s, edits } => {
                let mut data = m.series[*s].current.clone();
                for e in edits {
                    apply_edit(&m, &mut data, e);
                }
                m.clock += DAY;
                let sm = &mut m.series[*s];
                sm.current = data;
                sm.versions.push(Version {
                    number: sm.next,
                    time: m.clock,
                    live: true,
                    content: Arc::new(sm.current.clone()),
                });
                sm.next += 1;
            }
            Op::Slide { s } => {
                for i in leaving(&m.series[*s], LIVE[*s]) {
                    m.series[*s].versions[i].live = false;
                }
            }
            Op::Expire { s, which } => {
                let d = doomed(&m.series[*s], which);
                m.series[*s].versions.retain(|v| !d.contains(&v.number));
            }
            Op::Gc { .. } | Op::Restore { .. } => {}
            Op::Crash { op, point } => {
                // Before the commit nothing happened; after it (before unlinking
                // freed files) the first commit of the operation took effect.
                if *point == "commit.before_unlink" {
                    match op.as_ref() {
                        Op::Slide { s } => {
                            if let Some(&i) = leaving(&m.series[*s], LIVE[*s]).first() {
                                m.series[*s].versions[i].live = false;
                            }
                        }
                        Op::Expire { s, which } => {
                            if let Some(&n) = doomed(&m.series[*s], which).first() {
                                m.series[*s].versions.retain(|v| v.number != n);
                            }
                        }
                        other => m = Self::apply(m, other),
                    }
                }
            }
        }
        m
    }
}

struct Sut {
    dir: tempfile::TempDir,
    store: Option<Store>,
}

impl Sut {
    fn store(&self) -> &Store {
        self.store.as_ref().unwrap()
    }

    fn reopen(&mut self) {
        self.store = None;
        self.store = Some(Store::open(self.dir.path(), OpenMode::ReadWrite, "model test").unwrap());
    }

    fn backup(&self, s: usize, data: &[u8], time: i64) -> revault_engine::Result<()> {
        let src = StreamSource::new("model", std::io::Cursor::new(data.to_vec()));
        let opts = BackupOptions {
            unit: Some(UNITS[s]),
            time_unix: Some(time),
            ..Default::default()
        };
        backup(self.store(), SERIES[s], Box::new(src), &opts).map(|_| ())
    }

    /// The series' versions as the store has them now (before the operation).
    fn stored(&self, s: usize) -> revault_engine::Result<SeriesModel> {
        let st = self.store();
        let versions = match st.meta().series(SERIES[s])? {
            Some(rec) => st.versions(&rec)?,
            None => vec![],
        };
        Ok(SeriesModel {
            current: vec![],
            versions: versions
                .iter()
                .map(|v| Version {
                    number: v.number,
                    time: v.time_unix,
                    live: v.form == RecipeForm::Live,
                    content: Arc::new(vec![]),
                })
                .collect(),
            next: 0,
        })
    }

    /// Runs a store operation. `m` is the model after the operation.
    fn run(&self, op: &Op, m: &Model) -> revault_engine::Result<()> {
        let st = self.store();
        match op {
            Op::Backup { s, .. } => {
                let v = m.series[*s]
                    .versions
                    .last()
                    .expect("the model added the version");
                self.backup(*s, &v.content, v.time)
            }
            Op::Slide { s } => match st.meta().series(SERIES[*s])? {
                Some(_) => slide(st, SERIES[*s]).map(|_| ()),
                None => Ok(()),
            },
            Op::Expire { s, which } => {
                let pre = self.stored(*s)?;
                match which {
                    Which::BeforeNth(k) if !pre.versions.is_empty() => {
                        let cut = pre.versions[(*k).min(pre.versions.len() - 1)].time;
                        expire(st, SERIES[*s], &ExpireSel::Before(cut)).map(|_| ())
                    }
                    _ => {
                        for n in doomed(&pre, which) {
                            expire(st, SERIES[*s], &ExpireSel::Version(n))?;
                        }
                        Ok(())
                    }
                }
            }
            Op::Gc {
                full,
                compact_below,
            } => gc(
                st,
                &GcOptions {
                    full: *full,
                    compact_below: *compact_below,
                },
            )
            .map(|_| ()),
            Op::Restore { .. } | Op::Crash { .. } => Ok(()),
        }
    }
}

impl StateMachineTest for Sut {
    type SystemUnderTest = Sut;
    type Reference = StoreModel;

    fn init_test(_m: &Model) -> Sut {
        let (dir, store) = new_store(small_config());
        for (i, name) in SERIES.iter().enumerate() {
            revault_engine::set_retention(
                &store,
                name,
                // Slides and expiries are the model's operations, not automatic.
                Retention {
                    live: LIVE[i],
                    auto: false,
                    ..Default::default()
                },
            )
            .unwrap();
        }
        Sut {
            dir,
            store: Some(store),
        }
    }

    fn apply(mut sut: Sut, m: &Model, op: Op) -> Sut {
        match &op {
            Op::Restore { s, idx } => {
                if let Some(v) = m.series[*s].versions.get(*idx) {
                    let (got, _) = restore_bytes(sut.store(), SERIES[*s], v.number);
                    assert!(
                        got == *v.content,
                        "{} version {} differs",
                        SERIES[*s],
                        v.number
                    );
                }
            }
            Op::Crash { op: inner, point } => {
                sut.store().arm_failpoint(point);
                let r = match inner.as_ref() {
                    // A backup killed before its commit leaves no version: it
                    // backs up the series' current content, which the model
                    // does not record.
                    Op::Backup { s, .. } if *point != "commit.before_unlink" => {
                        sut.backup(*s, &m.series[*s].current, m.clock)
                    }
                    other => sut.run(other, m),
                };
                // An operation with nothing to do never reaches its failpoint.
                if let Err(e) = &r {
                    assert!(
                        e.to_string().contains("simulated crash"),
                        "{op:?} failed: {e}"
                    );
                }
                sut.reopen();
            }
            other => sut
                .run(other, m)
                .unwrap_or_else(|e| panic!("{other:?}: {e}")),
        }
        sut
    }

    fn check_invariants(sut: &Sut, m: &Model) {
        let st = sut.store();
        for (i, name) in SERIES.iter().enumerate() {
            let got: Vec<(u32, bool)> = match st.meta().series(name).unwrap() {
                Some(s) => st
                    .versions(&s)
                    .unwrap()
                    .iter()
                    .map(|v| (v.number, v.form == RecipeForm::Live))
                    .collect(),
                None => vec![],
            };
            let want: Vec<(u32, bool)> = m.series[i]
                .versions
                .iter()
                .map(|v| (v.number, v.live))
                .collect();
            assert_eq!(got, want, "{name}: versions and forms");
            for v in &m.series[i].versions {
                let (bytes, _) = restore_bytes(st, name, v.number);
                assert!(
                    bytes == *v.content,
                    "{name} version {} does not restore byte-exact",
                    v.number
                );
                assert!(
                    transfer_bytes(st, name, v.number) == *v.content,
                    "{name} version {} does not arrive byte-exact by block transfer",
                    v.number
                );
            }
        }
        let c = revault_engine::check(st).unwrap();
        assert!(c.ok, "check: {:?}", c.errors);
    }

    fn teardown(sut: Sut, m: Model) {
        let st = sut.store();
        for (i, name) in SERIES.iter().enumerate() {
            for v in &m.series[i].versions {
                expire(st, name, &ExpireSel::Version(v.number)).unwrap();
            }
        }
        gc(st, &GcOptions::default()).unwrap();
        let t = st.totals().unwrap();
        assert_eq!(
            (t.containers, t.container_bytes, t.units, t.logical_bytes),
            (0, 0, 0, 0),
            "{t:?}"
        );
        let files = std::fs::read_dir(st.data_dir()).unwrap().count();
        assert_eq!(files, 0, "the data directory is empty");
        assert!(revault_engine::check(st).unwrap().ok);
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: 32, max_shrink_iters: 2000, ..ProptestConfig::default() })]
    #[test]
    fn reverse_dedup_retention_and_gc_keep_every_version_exact(sequential 1..30 => Sut);
}
