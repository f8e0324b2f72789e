//! What the durable tier may evict: every container is a candidate except those a live
//! version reads. The live window is what restores are fastest for, so its containers stay
//! on local disk; archival versions may be read back from the bucket.

use std::collections::BTreeSet;

use crate::error::Result;
use crate::format::container::ContainerId;
use crate::format::records::RecipeForm;
use crate::meta::MetaRead;
use crate::recipe::{version_extents, Extent};
use crate::store::Store;

/// The containers the live versions of every series read, from one snapshot.
pub fn live_containers(store: &Store) -> Result<BTreeSet<ContainerId>> {
    let view = store.read_view();
    let mut out = BTreeSet::new();
    for s in view.all_series()? {
        for v in view.versions(&s)? {
            if v.form != RecipeForm::Live {
                continue;
            }
            let (mut ex, _) = version_extents(&view, &s, &v)?;
            while let Some(e) = ex.next(&view)? {
                if let Extent::Stored { container, .. } = e {
                    out.insert(container);
                }
            }
        }
    }
    Ok(out)
}
