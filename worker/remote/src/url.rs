//! `s3://BUCKET[/PREFIX]`: where a store's durable copy lives.

use std::fmt;

use crate::error::{RemoteError, Result};

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemoteUrl {
    pub bucket: String,
    /// Empty, or ends without a slash; object names are `PREFIX/NAME`.
    pub prefix: String,
}

impl RemoteUrl {
    pub fn parse(s: &str) -> Result<RemoteUrl> {
        let bad = |why: &str| {
            RemoteError::Invalid(format!(
                "remote {s:?}: {why} (expected s3://BUCKET or s3://BUCKET/PREFIX)"
            ))
        };
        let rest = s
            .strip_prefix("s3://")
            .ok_or_else(|| bad("not an s3:// URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        // S3's bucket naming rules (3-63 of lowercase letters, digits, '-' and '.').
        let ok_bucket = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && bucket.as_bytes()[0].is_ascii_alphanumeric()
            && bucket.as_bytes()[bucket.len() - 1].is_ascii_alphanumeric();
        if !ok_bucket {
            return Err(bad(
                "a bucket name is 3-63 lowercase letters, digits, '-' and '.'",
            ));
        }
        let prefix = prefix.trim_end_matches('/');
        if prefix.split('/').any(|c| c == "." || c == "..")
            || prefix.contains("//")
            || prefix.bytes().any(|b| b.is_ascii_control())
            || prefix.len() > 512
        {
            return Err(bad("the prefix must be plain path components"));
        }
        Ok(RemoteUrl {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// The bucket key of object `name` (relative to the store's prefix).
    pub fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    /// The name (relative to the prefix) of bucket key `key`, if it lies under the prefix.
    pub fn name_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        if self.prefix.is_empty() {
            Some(key)
        } else {
            key.strip_prefix(&self.prefix)?.strip_prefix('/')
        }
    }
}

impl fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_names_keys() {
        let u = RemoteUrl::parse("s3://backups/cluster-a/node1/").unwrap();
        assert_eq!(u.bucket, "backups");
        assert_eq!(u.prefix, "cluster-a/node1");
        assert_eq!(u.key("data/1"), "cluster-a/node1/data/1");
        assert_eq!(u.name_of("cluster-a/node1/data/1"), Some("data/1"));
        assert_eq!(u.name_of("cluster-a/node10/data/1"), None);
        assert_eq!(u.to_string(), "s3://backups/cluster-a/node1");
        let u = RemoteUrl::parse("s3://backups").unwrap();
        assert_eq!(u.key("data/1"), "data/1");
    }

    #[test]
    fn refuses_what_is_not_a_bucket_url() {
        for bad in [
            "backups",
            "http://backups",
            "s3://",
            "s3://ab",
            "s3://Backups",
            "s3://-b-",
            "s3://b_b/x",
            "s3://bucket/../x",
            "s3://bucket/a//b",
        ] {
            let e = RemoteUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected s3://BUCKET"), "{bad}: {e}");
        }
    }
}
