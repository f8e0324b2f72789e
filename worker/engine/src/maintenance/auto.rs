//! Automatic retention: a series whose stored retention says `auto` slides
//! what leaves its live window and expires what its retention no longer
//! keeps, right after each backup commits (the backup still holds the
//! series) and from the server's scheduler (catching up whatever that
//! missed).

use crate::error::Result;
use crate::maintenance::expire::{expire_claimed, ExpireReport, ExpireSel};
use crate::maintenance::slide::{slide_claimed, SlideReport};
use crate::meta::MetaRead;
use crate::store::Store;

/// Slides what left the live window and expires what retention no longer
/// keeps, if the series' retention is automatic *now*: it is read under the
/// series claim, which a change of retention also takes. (A scheduler that
/// decided from an earlier listing expired versions right after a client
/// had turned automatic retention off; issue 18.) `None` when it is not
/// automatic or the series does not exist.
pub fn apply_auto(store: &Store, series: &str) -> Result<Option<(SlideReport, ExpireReport)>> {
    store.require_writable()?;
    let _claim = store.claim_series(series)?;
    apply_auto_claimed(store, series)
}

/// [`apply_auto`] for a caller that holds the series claim (a backup that
/// just committed).
pub(crate) fn apply_auto_claimed(
    store: &Store,
    series: &str,
) -> Result<Option<(SlideReport, ExpireReport)>> {
    if !store.meta.series(series)?.is_some_and(|s| s.retention.auto) {
        return Ok(None);
    }
    let slid = slide_claimed(store, series)?;
    let expired = expire_claimed(store, series, &ExpireSel::Retention)?;
    Ok(Some((slid, expired)))
}
