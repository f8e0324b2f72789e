//! Where `revault restore -o` writes a version: stdout, a device in place, a directory it
//! extracts into, or a file written beside its name and renamed when complete.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use revault_engine::{restore, RestoreOptions, RestoreReport, RestoreTarget, Store, VersionSel};

use crate::output;

/// Where `revault restore -o` writes a version.
pub enum Destination {
    /// `-`: the bytes (a tar stream for a directory version) on stdout.
    Stdout,
    /// An existing device or FIFO (e.g. /dev/null): written in place, never replaced.
    InPlace,
    /// A directory version extracted into a directory: one that exists or ends in `/`, or a
    /// new path not named like a tar file.
    Dir,
    /// A stream version's bytes in a file.
    File,
    /// A directory version as a tar file (the path exists as a file or ends in `.tar`).
    Tar,
}

impl Destination {
    pub fn of(output: &str, kind: revault_engine::VersionKind) -> Destination {
        let path = Path::new(output);
        let meta = std::fs::metadata(path).ok();
        let tree = kind == revault_engine::VersionKind::Tree;
        let named_tar = output::named_like_tar(output);
        match meta {
            _ if output == "-" => Destination::Stdout,
            Some(m) if m.is_dir() => Destination::Dir,
            Some(m) if !m.is_file() => Destination::InPlace,
            _ if output.ends_with('/') => Destination::Dir,
            // Asked for `-o restored`, a user of a directory version wants the directory, not
            // a tar file named like one (issue 21).
            None if tree && !named_tar => Destination::Dir,
            _ if tree => Destination::Tar,
            _ => Destination::File,
        }
    }

    /// What was written, for the summary line.
    pub fn describe(&self, output: &str) -> String {
        match self {
            Destination::Stdout => "to stdout".into(),
            Destination::InPlace => format!("written into {output}"),
            Destination::Dir => format!("extracted into directory {output}"),
            Destination::File => format!("written to file {output}"),
            Destination::Tar => format!("written as a tar archive to {output}"),
        }
    }
}

/// Writes beside the target and renames at the end: a failed restore never leaves a truncated
/// file under the requested name.
pub fn restore_to_file(
    store: &Store,
    series: &str,
    output: &str,
    sel: VersionSel,
    opts: &RestoreOptions,
) -> revault_engine::Result<RestoreReport> {
    let partial = PathBuf::from(format!("{output}.revault-partial"));
    let f = File::create(&partial).map_err(|e| revault_engine::Error::Io {
        context: format!("creating {}", partial.display()),
        source: e,
    })?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let r = restore(store, series, sel, opts, RestoreTarget::Writer(&mut w)).and_then(|rep| {
        w.flush().map_err(|e| revault_engine::Error::Io {
            context: format!("writing {}", partial.display()),
            source: e,
        })?;
        Ok(rep)
    });
    let r = r.and_then(|rep| {
        std::fs::rename(&partial, output).map_err(|e| revault_engine::Error::Io {
            context: format!("renaming {} to {output}", partial.display()),
            source: e,
        })?;
        Ok(rep)
    });
    if r.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    r
}
