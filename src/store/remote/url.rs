//! `s3://BUCKET/PREFIX` URLs: where a pack lives on object storage, and the keys of its
//! objects under the prefix.

use std::fmt;

/// A pack's place on object storage: a bucket and a key prefix (no leading or trailing `/`;
/// empty for the bucket's root).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct S3Url {
    pub bucket: String,
    pub prefix: String,
}

/// Whether `s` names a place on object storage (`s3://…`).
pub fn is_s3_url(s: &str) -> bool {
    s.starts_with("s3://")
}

impl S3Url {
    /// Parses `s3://BUCKET/PREFIX` (the prefix may be empty; slashes around it are dropped).
    ///
    /// Errors: not an `s3://` URL, an empty bucket, or a bucket name with characters S3 does
    /// not allow (the message quotes the URL).
    pub fn parse(s: &str) -> Result<Self, String> {
        let rest = s
            .strip_prefix("s3://")
            .ok_or_else(|| format!("'{s}' is not an s3://BUCKET/PREFIX URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
        if bucket.is_empty() || !bucket.chars().all(ok) {
            return Err(format!(
                "'{s}': the bucket name must be lower-case letters, digits, '-' and '.'"
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|p| p == "." || p == "..") {
            return Err(format!("'{s}': the prefix may not hold '.' or '..'"));
        }
        Ok(Self {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// The key of the object `name` under the prefix.
    pub fn key(&self, name: &str) -> String {
        match self.prefix.is_empty() {
            true => name.to_string(),
            false => format!("{}/{name}", self.prefix),
        }
    }

    /// The URL of the object `name` (`s3://BUCKET/PREFIX/NAME`), for messages.
    pub fn object(&self, name: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key(name))
    }
}

impl fmt::Display for S3Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_bucket_and_prefix() {
        let u = S3Url::parse("s3://models/packs/k3/").unwrap();
        assert_eq!(
            (u.bucket.as_str(), u.prefix.as_str()),
            ("models", "packs/k3")
        );
        assert_eq!(u.key("manifest.json"), "packs/k3/manifest.json");
        assert_eq!(u.object("spine.bin"), "s3://models/packs/k3/spine.bin");
        assert_eq!(u.to_string(), "s3://models/packs/k3");
        let root = S3Url::parse("s3://models").unwrap();
        assert_eq!(root.key("manifest.json"), "manifest.json");
        assert_eq!(
            S3Url::parse("s3://Models/x").unwrap_err(),
            "'s3://Models/x': the bucket name must be lower-case letters, digits, '-' and '.'"
        );
        assert_eq!(
            S3Url::parse("/tmp/pack").unwrap_err(),
            "'/tmp/pack' is not an s3://BUCKET/PREFIX URL"
        );
        assert_eq!(
            S3Url::parse("s3://b/a/../c").unwrap_err(),
            "'s3://b/a/../c': the prefix may not hold '.' or '..'"
        );
    }
}
