//! Sealing a series that moved to another worker: it takes no new version here, and a backup
//! names the new address instead of being acknowledged where nothing will look for it.

use crate::error::{Error, Result};
use crate::format::records::SeriesRecord;
use crate::meta::MetaRead;
use crate::store::commit::Txn;
use crate::store::{check_series_name, Store};

/// The longest address a series can be marked as moved to.
pub const MAX_ADDRESS: usize = 1024;

/// Marks `series` as moved to `to` (an address), or with `None` takes the mark away. Under the
/// series' claim: a backup in progress makes this fail with `SeriesBusy`, and a backup that
/// starts afterwards finds the mark and fails with `SeriesMoved`. So once this returns, no
/// version is added here until the mark is taken away.
pub fn set_moved_to(store: &Store, series: &str, to: Option<String>) -> Result<SeriesRecord> {
    store.require_writable()?;
    check_series_name(series)?;
    // The address is echoed in every refused backup's message: an address, not a payload.
    if to.as_deref().is_some_and(|t| {
        t.trim().is_empty() || t.len() > MAX_ADDRESS || t.chars().any(char::is_control)
    }) {
        return Err(Error::Invalid(format!(
            "the address a series moved to must be 1 to {MAX_ADDRESS} bytes without control characters"
        )));
    }
    let _claim = store.claim_series(series)?;
    if store.meta.series(series)?.is_none() {
        return Err(Error::UnknownSeries(series.to_string()));
    }
    let mut txn = Txn::default();
    txn.series_updates.push((
        series.to_string(),
        Box::new(move |cur| {
            let mut s = cur.expect("the series exists under its claim");
            s.moved_to = to;
            s
        }),
    ));
    store.commit(txn)?;
    store.series(series)
}
