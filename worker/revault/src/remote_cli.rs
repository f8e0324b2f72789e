//! The CLI's side of the durable tier: opening a store with its remote, making a command's
//! change durable before it returns, and the `recover` and `remote` commands.

use std::ops::Deref;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use revault_engine::{OpenMode, Store};
use revault_remote::{
    EvictOptions, LocalConfig, ObjectLock, RecoverOptions, Remote, RemoteError, RemoteUrl,
    RotateOptions,
};

use crate::cli::StoreArg;
use crate::output::{self, mib};

/// `init`'s remote flags.
#[derive(Args, Clone, Debug)]
pub struct RemoteInitArgs {
    /// Keep an encrypted copy of the store in this bucket: s3://BUCKET[/PREFIX]. The bucket
    /// is created if missing; credentials and endpoint come from AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION and AWS_ENDPOINT_URL.
    #[arg(long, requires = "key_file")]
    pub remote: Option<String>,
    /// The key file that unlocks the remote (created, 32 random bytes, if missing). Keep a
    /// copy elsewhere: without it the remote cannot be read.
    #[arg(long, env = "REVAULT_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Write every object with S3 Object Lock, kept this many days (the bucket must be
    /// created with Object Lock, which `init` does when it creates it).
    #[arg(long, requires = "remote", value_parser = clap::value_parser!(u32).range(1..=36500))]
    pub object_lock_days: Option<u32>,
    /// Object Lock mode: compliance (nobody can delete early) or governance.
    #[arg(long, default_value = "compliance", value_parser = ["compliance", "governance"])]
    pub object_lock_mode: String,
}

/// A store opened by a command, with its remote when it has one.
pub struct Opened {
    pub store: Store,
    pub remote: Option<Remote>,
    /// The store has a remote that could not be reached when it was opened.
    unreachable: Option<RemoteError>,
}

impl Deref for Opened {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

/// A change committed locally that the remote does not hold yet.
#[derive(Debug, thiserror::Error)]
#[error("{what} is committed in the local store, but the remote does not hold it yet: {source}; {}", next_step(.source))]
pub struct NotDurable {
    pub what: String,
    #[source]
    pub source: RemoteError,
}

/// What gets the change into the remote, as far as this store can tell.
fn next_step(e: &RemoteError) -> &'static str {
    match e {
        RemoteError::Fenced { .. } => {
            "it never will from this store, which another took over: this copy is out of date (docs/remote.md, \"Fencing\")"
        }
        RemoteError::Diverged { .. } => "nothing is uploaded until someone decides (docs/remote.md, \"Fencing\")",
        _ => "the next command that changes the store, or `revault remote sync`, uploads it",
    }
}

/// The exit status of a command whose change is committed locally but not in the remote.
pub const NOT_DURABLE_EXIT: i32 = 3;

impl Opened {
    /// Returns once the remote holds everything committed (nothing to do without one).
    pub fn durable(&self, what: impl FnOnce() -> String) -> Result<()> {
        if let Some(e) = &self.unreachable {
            return Err(NotDurable {
                what: what(),
                source: RemoteError::Unreachable {
                    what: "opening the store's remote".into(),
                    detail: e.to_string(),
                },
            }
            .into());
        }
        if let Some(r) = &self.remote {
            match r.sync(&self.store) {
                Err(source) => {
                    return Err(NotDurable {
                        what: what(),
                        source,
                    }
                    .into())
                }
                Ok(rep) => {
                    if let Some(e) = rep.lock_upkeep_error {
                        eprintln!("warning: the remote holds the change, but {e}");
                    }
                }
            }
        }
        Ok(())
    }
}

/// Opens the store and attaches its remote. A read-write command needs the remote (it must
/// make its change durable), except that an unreachable one only delays that: the command
/// runs and reports what is not durable yet. A read-only command without its remote still
/// reads every container on local disk.
pub fn open(store: &StoreArg, mode: OpenMode, what: &str) -> Result<Opened> {
    let s = Store::open(&store.store, mode, what)?;
    let (remote, unreachable) = match Remote::attach(&s, None) {
        Ok(r) => (r, None),
        Err(e) if mode == OpenMode::ReadOnly || e.is_transient() => {
            eprintln!(
                "warning: the store's remote is not reachable ({e}); working on local disk only"
            );
            (None, Some(e))
        }
        Err(e) => return Err(e.into()),
    };
    if let (Some(r), OpenMode::ReadWrite) = (&remote, mode) {
        // The command returns only once the bucket holds its change: its containers go up
        // while it runs rather than all after it (docs/remote.md, "Sync").
        r.upload_as_sealed(&s);
    }
    Ok(Opened {
        store: s,
        remote,
        unreachable,
    })
}

/// `init --remote` after the store's own init: gives the new store its remote, and when that
/// fails removes the store again (it holds nothing yet), so that `init` can be run again
/// rather than leave a store that silently has no remote.
pub fn init_remote_or_undo(
    root: &std::path::Path,
    existed: bool,
    a: &RemoteInitArgs,
) -> Result<Option<revault_remote::InitReport>> {
    let r = Store::open(root, OpenMode::ReadWrite, "revault init")
        .map_err(anyhow::Error::from)
        .and_then(|store| init_remote(&store, a));
    if r.is_err() {
        // The marker first: from then on nothing takes the directory for a store.
        let _ = std::fs::remove_file(root.join("revault.store"));
        for d in [revault_engine::META_DIR, "data", "remote"] {
            let _ = std::fs::remove_dir_all(root.join(d));
        }
        let _ = std::fs::remove_file(root.join("lock"));
        if !existed {
            let _ = std::fs::remove_dir(root);
        }
    }
    r
}

/// `init --remote`: gives the new store its remote.
pub fn init_remote(
    store: &Store,
    a: &RemoteInitArgs,
) -> Result<Option<revault_remote::InitReport>> {
    let Some(url) = &a.remote else {
        return Ok(None);
    };
    let url = RemoteUrl::parse(url)?;
    let Some(key_file) = a.key_file.clone() else {
        bail!("--remote needs --key-file");
    };
    let object_lock = a.object_lock_days.map(|days| ObjectLock {
        compliance: a.object_lock_mode == "compliance",
        seconds: u64::from(days) * 86_400,
    });
    let (_, rep) = Remote::init(
        store,
        &revault_remote::InitRemote {
            url,
            key_file,
            object_lock,
        },
    )?;
    Ok(Some(rep))
}

/// What `init --remote` says beside the store's settings.
pub fn print_init(a: &RemoteInitArgs, r: &revault_remote::InitReport) {
    println!(
        "remote {} holds store {}{}",
        a.remote.as_deref().unwrap_or(""),
        r.store,
        if r.created_bucket {
            " (bucket created)"
        } else {
            ""
        }
    );
    if r.created_key_file {
        let key = a.key_file.as_deref().unwrap_or(std::path::Path::new(""));
        println!(
            "new key file {}: keep a copy elsewhere, the remote cannot be read without it",
            key.display()
        );
    }
}

#[derive(Args)]
pub struct RecoverArgs {
    /// The remote to rebuild from: s3://BUCKET[/PREFIX].
    #[arg(long)]
    pub remote: String,
    /// The key file the store was initialised with.
    #[arg(long, env = "REVAULT_KEY_FILE")]
    pub key_file: PathBuf,
    /// The new store's directory (new or empty).
    #[arg(long)]
    pub store: PathBuf,
    /// Keep containers in another directory (e.g. an HDD) than the metadata.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Leave the containers in the bucket and read them on demand instead of downloading
    /// them now.
    #[arg(long)]
    pub lazy: bool,
}

pub fn recover(a: RecoverArgs, json: bool) -> Result<()> {
    let opts = RecoverOptions {
        url: RemoteUrl::parse(&a.remote)?,
        key_file: a.key_file,
        store: a.store.clone(),
        data_dir: a.data_dir,
        lazy: a.lazy,
    };
    let (_store, _remote, rep) = revault_remote::recover(&opts)?;
    if json {
        output::json(&rep);
        return Ok(());
    }
    println!(
        "recovered store {} into {} from {} (head of {}), as generation {}: {} series, {} containers ({} downloaded, {} MiB), {} MiB of metadata, in {:.1}s",
        rep.store,
        a.store.display(),
        rep.head,
        rep.head_time,
        rep.generation,
        rep.series.len(),
        rep.containers,
        rep.containers_downloaded,
        mib(rep.container_bytes_downloaded),
        mib(rep.meta_bytes_downloaded),
        rep.seconds
    );
    for s in &rep.series {
        println!(
            "  {}: {} versions, latest {}",
            s.name,
            s.versions,
            s.latest
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into())
        );
    }
    Ok(())
}

#[derive(clap::Subcommand)]
pub enum RemoteCmd {
    /// The store's remote: where, which generation, the newest head, durable versions.
    Status(StoreArg),
    /// Upload what the remote does not hold yet, and delete what no head needs.
    Sync(StoreArg),
    /// Remove from local disk the containers no live version reads (they stay in the
    /// bucket and are read back on demand).
    Evict(EvictArgs),
    /// Let a new key file open the remote instead of the old one; nothing is re-encrypted
    /// (docs/remote.md, "Keys").
    RotateKey(RotateKeyArgs),
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["store", "remote"])))]
pub struct RotateKeyArgs {
    /// The store whose remote it is; its recorded key file becomes the new one. The store
    /// must not be in use (stop its worker; in a cluster, use --remote).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// The remote, s3://BUCKET[/PREFIX], when no store here records it (a worker keeps
    /// running on its key meanwhile).
    #[arg(long)]
    pub remote: Option<String>,
    /// The key file being replaced, which opens the remote now (default with --store: the
    /// one it records; REVAULT_KEY_FILE is not read here).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Every store under --remote (in a cluster, the remote.url all workers' prefixes are
    /// under), one after another; one that fails is reported and the others go on.
    #[arg(long, requires = "remote")]
    pub every_store: bool,
    /// The key file that will open it (created, 32 random bytes, by the first step).
    #[arg(long)]
    pub new_key_file: PathBuf,
    /// The second step: drop the old key file (the first step, without this flag, added
    /// the new one). Run it once the new key file is copied somewhere safe, and in a
    /// cluster once every worker runs with it.
    #[arg(long)]
    pub drop_old: bool,
}

#[derive(Args)]
pub struct EvictArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// Keep containers written more recently than this (e.g. 24h, 0 for none).
    #[arg(long, default_value = "24h", value_parser = crate::server::parse_duration)]
    pub older_than: Duration,
}

pub fn remote(c: RemoteCmd, json: bool) -> Result<()> {
    match c {
        RemoteCmd::Status(a) => status(a, json),
        RemoteCmd::Sync(a) => {
            let o = open(&a, OpenMode::ReadWrite, "revault remote sync")?;
            let r = require(&o)?;
            let rep = r.sync(&o)?;
            if json {
                output::json(&rep);
            } else {
                println!(
                    "{}: {}; uploaded {} containers ({} MiB) and {} metadata files ({} MiB), deleted {} objects, in {:.2}s",
                    r.url(),
                    rep.head.as_deref().map(|h| format!("published {h}")).unwrap_or_else(|| "already current".into()),
                    rep.containers_uploaded,
                    mib(rep.container_bytes_uploaded),
                    rep.meta_files_uploaded,
                    mib(rep.meta_bytes_uploaded),
                    rep.objects_deleted,
                    rep.seconds
                );
            }
            Ok(())
        }
        RemoteCmd::RotateKey(a) => rotate_key(a, json),
        RemoteCmd::Evict(a) => {
            let o = open(&a.store, OpenMode::ReadWrite, "revault remote evict")?;
            let r = require(&o)?;
            let rep = r.evict(
                &o,
                &EvictOptions {
                    older_than: a.older_than,
                },
            )?;
            if json {
                output::json(&rep);
            } else {
                println!(
                    "evicted {} containers ({} MiB); kept {} a live version reads and {} recent ones ({} MiB on local disk); {} not uploaded yet",
                    rep.evicted,
                    mib(rep.evicted_bytes),
                    rep.live,
                    rep.recent,
                    mib(rep.local_bytes_after),
                    rep.not_uploaded
                );
            }
            Ok(())
        }
    }
}

fn rotate_key(a: RotateKeyArgs, json: bool) -> Result<()> {
    // With a store, it is held open (its lock) so that nothing else rewrites its record of
    // the remote while the rotation changes the key file in it.
    let store = match &a.store {
        Some(root) => Some(Store::open(
            root,
            OpenMode::ReadWrite,
            "revault remote rotate-key",
        )?),
        None => None,
    };
    let recorded = match &store {
        Some(s) => Some(
            LocalConfig::read(s.root())?
                .ok_or_else(|| anyhow::anyhow!("{} has no remote", s.root().display()))?,
        ),
        None => None,
    };
    let url = match (&a.remote, &recorded) {
        (Some(u), _) => RemoteUrl::parse(u)?,
        (None, Some(c)) => c.url.clone(),
        (None, None) => bail!("give --store or --remote"),
    };
    let key_file = match (a.key_file, &recorded) {
        (Some(k), _) => k,
        (None, Some(c)) => c.key_file.clone(),
        (None, None) => bail!("give --key-file: a key file that opens {url} now"),
    };
    let opts = |url: RemoteUrl| RotateOptions {
        url,
        key_file: key_file.clone(),
        new_key_file: a.new_key_file.clone(),
        drop_old: a.drop_old,
        store_root: store.as_ref().map(|s| s.root().to_path_buf()),
    };
    if !a.every_store {
        let rep = revault_remote::rotate_key(&opts(url))?;
        if json {
            output::json(&rep);
        } else {
            say_rotated(&rep, &a.new_key_file);
        }
        if store.is_some() && rep.finished {
            warn_if_env_overrides(&a.new_key_file);
        }
        return Ok(());
    }
    let urls = revault_remote::stores_under(&url)?;
    if urls.is_empty() {
        bail!("{url} holds no store (no revault-remote.json under it)");
    }
    // Every store is tried: one that fails (a stranger's store under the prefix, say) must
    // not keep the others on the old key.
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for url in urls {
        match revault_remote::rotate_key(&opts(url.clone())) {
            Ok(rep) => {
                if !json {
                    say_rotated(&rep, &a.new_key_file);
                }
                out.push(serde_json::to_value(&rep)?);
            }
            Err(e) => {
                if !json {
                    eprintln!("{url}: not rotated: {e}");
                }
                out.push(serde_json::json!({
                    "remote": url.to_string(),
                    "error": {"code": e.code(), "message": e.to_string()},
                }));
                failed.push(url.to_string());
            }
        }
    }
    let msg = format!(
        "{} of {} stores were not rotated ({}); run the command again once their errors are dealt with",
        failed.len(),
        out.len(),
        failed.join(", ")
    );
    if json {
        // One document: what each store did, and the error if some were not rotated.
        let mut doc = serde_json::json!({ "stores": out });
        if !failed.is_empty() {
            doc["error"] = serde_json::json!({ "code": "partly_rotated", "message": msg });
            output::json(&doc);
            eprintln!("error: {msg}");
            std::process::exit(1);
        }
        output::json(&doc);
        return Ok(());
    }
    if !failed.is_empty() {
        bail!(msg);
    }
    Ok(())
}

fn say_rotated(rep: &revault_remote::RotateReport, new_key_file: &std::path::Path) {
    let opened_by = format!(
        "opened now by key file{} {}",
        if rep.key_files.len() == 1 { "" } else { "s" },
        rep.key_files.join(", ")
    );
    match &rep.removed {
        _ if !rep.finished => println!(
            "{}: {} key file {} ({}); {opened_by}. Copy {} somewhere safe (without it the remote cannot be read; in a cluster, roll it out to the workers), then run this command again with --drop-old",
            rep.remote,
            if rep.created_key_file { "created and added" } else if rep.added { "added" } else { "already added" },
            new_key_file.display(),
            rep.new_key_file,
            new_key_file.display()
        ),
        _ if rep.same_key => println!(
            "{}: {} is the key file that opens it, and the only one: nothing to rotate",
            rep.remote,
            new_key_file.display()
        ),
        Some(old) => println!("{}: key file {old} dropped; {opened_by}", rep.remote),
        None => println!("{}: already rotated; {opened_by}", rep.remote),
    }
    if rep.finished && rep.older_descriptor_versions.unwrap_or(0) > 0 {
        println!(
            "  the bucket keeps {} older versions of its descriptor, which the old key file still opens: delete them (docs/remote.md, \"Keys\")",
            rep.older_descriptor_versions.unwrap_or(0)
        );
    }
}

/// `REVAULT_KEY_FILE` is read before the store's record: left pointing at the old key file,
/// it would make every later command fail.
fn warn_if_env_overrides(new_key_file: &std::path::Path) {
    let abs = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    if let Some(env) = std::env::var_os("REVAULT_KEY_FILE") {
        if abs(std::path::Path::new(&env)) != abs(new_key_file) {
            eprintln!(
                "warning: REVAULT_KEY_FILE={} overrides the key file the store records ({}); point it at the new one",
                std::path::Path::new(&env).display(),
                new_key_file.display()
            );
        }
    }
}

fn require(o: &Opened) -> Result<&Remote> {
    match &o.remote {
        Some(r) => Ok(r),
        None => bail!(
            "{} has no remote (give one with `revault init --remote`, or rebuild a store with `revault recover`)",
            o.store.root().display()
        ),
    }
}

fn status(a: StoreArg, json: bool) -> Result<()> {
    let o = open(&a, OpenMode::ReadOnly, "revault remote status")?;
    let r = require(&o)?;
    let head = r.head();
    let mut series = Vec::new();
    for s in o.list_series()? {
        let latest = o.versions(&s)?.last().map(|v| v.number);
        series.push(serde_json::json!({
            "series": s.name,
            "latestVersion": latest,
            "durableVersion": r.durable_version(&s.name),
        }));
    }
    if json {
        output::json(&serde_json::json!({
            "remote": r.url().to_string(),
            "store": r.store_id(),
            "generation": r.generation(),
            "head": head.as_ref().map(head_name),
            "headTime": head.as_ref().map(|h| h.time.clone()),
            "series": series,
        }));
        return Ok(());
    }
    println!("remote      {}", r.url());
    println!(
        "store       {} (generation {})",
        r.store_id(),
        r.generation()
    );
    match &head {
        Some(h) => println!(
            "newest head {} of {} ({} containers, {} MiB)",
            head_name(h),
            h.time,
            h.containers,
            mib(h.container_bytes)
        ),
        None => println!("newest head none yet"),
    }
    let mut t = output::Table::new(&["series", "latest", "durable"]);
    for s in &series {
        let v = |k: &str| {
            s[k].as_u64()
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into())
        };
        t.row(vec![
            s["series"].as_str().unwrap_or("").to_string(),
            v("latestVersion"),
            v("durableVersion"),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}

fn head_name(h: &revault_remote::Head) -> String {
    format!("{:08x}-{:016x}", h.generation, h.seq)
}
