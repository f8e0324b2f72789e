//! Reading a bucket's index in key order: pages of a listing (with S3's
//! delimiter and common prefixes), and a bucket's totals.

use std::collections::HashMap;

use revault_engine::{check_series_name, keys::bucket_objects_prefix, MetaRead, Store};

use crate::records::{bucket_record, bucket_versions, decode_record, version_exists, CF};
use crate::{ObjResult, ObjectError, ObjectInfo};

/// One page of a listing.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    pub objects: Vec<ObjectInfo>,
    /// With a delimiter: the distinct key prefixes up to and including the
    /// delimiter after `prefix` (as S3's CommonPrefixes).
    pub common_prefixes: Vec<String>,
    /// Pass as `start_after` for the next page; `None` on the last page.
    pub next_start_after: Option<String>,
}

/// Lists keys starting with `prefix`, in key order, after `start_after`, at
/// most `limit` entries (objects and common prefixes together). A bucket
/// that does not exist lists empty.
pub fn list(
    store: &Store,
    bucket: &str,
    prefix: &str,
    delimiter: Option<&str>,
    start_after: Option<&str>,
    limit: usize,
) -> ObjResult<Listing> {
    check_series_name(bucket)?;
    let delimiter = delimiter.filter(|d| !d.is_empty());
    // Entries are checked against their version one by one, as `head` does:
    // a page holds far fewer keys than the bucket may have versions.
    let meta = store.meta();
    let series = meta.series(bucket)?;
    let base = bucket_objects_prefix(bucket);
    let scan_prefix = [base.as_slice(), prefix.as_bytes()].concat();
    let mut from = scan_prefix.clone();
    if let Some(s) = start_after {
        let after = [base.as_slice(), s.as_bytes()].concat();
        if after > from {
            from = after;
        }
    }
    let mut out = Listing::default();
    let mut last: Option<String> = None;
    meta.for_each_from(CF, &from, &scan_prefix, |k, v| {
        let key = String::from_utf8_lossy(&k[base.len()..]).into_owned();
        if let Some(s) = start_after {
            // Skip the start key itself, and everything under a common prefix
            // that ended the previous page.
            if key.as_str() <= s
                || (delimiter.is_some_and(|d| s.ends_with(d)) && key.starts_with(s))
            {
                return Ok(true);
            }
        }
        let rest = &key[prefix.len()..];
        if let Some(d) = delimiter {
            if let Some(i) = rest.find(d) {
                let cp = format!("{prefix}{}", &rest[..i + d.len()]);
                if out.common_prefixes.last() == Some(&cp) {
                    return Ok(true);
                }
                if out.objects.len() + out.common_prefixes.len() == limit {
                    out.next_start_after = last.take();
                    return Ok(false);
                }
                last = Some(cp.clone());
                out.common_prefixes.push(cp);
                return Ok(true);
            }
        }
        let rec = decode_record(bucket, k, v)?;
        if !version_exists(meta, series.as_ref(), rec.version)? {
            return Ok(true);
        }
        if out.objects.len() + out.common_prefixes.len() == limit {
            out.next_start_after = last.take();
            return Ok(false);
        }
        last = Some(key.clone());
        out.objects.push(ObjectInfo {
            bucket: bucket.to_string(),
            key,
            record: rec,
        });
        Ok(true)
    })?;
    Ok(out)
}

/// Totals of a bucket.
#[derive(Clone, Debug, Default)]
pub struct BucketSummary {
    pub bucket: String,
    pub created_unix: i64,
    pub objects: u64,
    /// Content bytes of all objects.
    pub size: u64,
    /// Bytes uploaded for them (compressed sizes for gzip uploads).
    pub uploaded_bytes: u64,
    /// Container bytes the objects' versions wrote (what they added to the store).
    pub stored_bytes: u64,
}

pub fn summary(store: &Store, bucket: &str) -> ObjResult<BucketSummary> {
    check_series_name(bucket)?;
    let Some(b) = bucket_record(store.meta(), bucket)? else {
        return Err(ObjectError::NoBucket(bucket.to_string()));
    };
    let versions: HashMap<u32, u64> = bucket_versions(store, bucket)?
        .iter()
        .map(|v| (v.number, v.new_container_bytes))
        .collect();
    let mut out = BucketSummary {
        bucket: bucket.to_string(),
        created_unix: b.created_unix,
        ..Default::default()
    };
    let base = bucket_objects_prefix(bucket);
    store.meta().for_each_prefix(CF, &base, |k, v| {
        let rec = decode_record(bucket, k, v)?;
        if let Some(stored) = versions.get(&rec.version) {
            out.objects += 1;
            out.size += rec.size;
            out.uploaded_bytes += rec.uploaded_bytes;
            out.stored_bytes += stored;
        }
        Ok(true)
    })?;
    Ok(out)
}
