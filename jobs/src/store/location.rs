//! Where an input or output lives, as the flags spell it: `file:///abs/path[/]` or
//! `s3://bucket[/key-or-prefix[/]]`.

use std::path::PathBuf;

/// A parsed `--input` or `--output` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// An absolute path on this machine (a mounted volume).
    Local { path: PathBuf, is_directory: bool },
    /// A key or key prefix in an S3 bucket (empty: the whole bucket).
    S3 { bucket: String, key: String, is_directory: bool },
}

impl Location {
    /// Parses a URL. A trailing `/` says the URL names a directory (prefix), not one object.
    pub fn parse(url: &str) -> Result<Self, String> {
        let is_directory = url.ends_with('/');
        if let Some(path) = url.strip_prefix("file://") {
            // `file:///data/x` has an empty host; `file://host/x` names another machine.
            if !path.starts_with('/') {
                return Err(format!("{url:?}: a file URL must name an absolute path, as file:///data/input/"));
            }
            return Ok(Self::Local { path: PathBuf::from(path), is_directory });
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(format!("{url:?}: no bucket, as s3://bucket/prefix/"));
            }
            // An S3 URL that names only its bucket names all of it.
            let is_directory = is_directory || key.is_empty();
            return Ok(Self::S3 { bucket: bucket.to_owned(), key: key.to_owned(), is_directory });
        }
        Err(format!("{url:?}: not a file:/// or s3:// URL"))
    }

    /// Whether the URL names a directory or prefix (else it may name one object).
    pub fn is_directory(&self) -> bool {
        match self {
            Self::Local { is_directory, .. } | Self::S3 { is_directory, .. } => *is_directory,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls() {
        assert_eq!(
            Location::parse("file:///data/input/corpus.jsonl"),
            Ok(Location::Local { path: "/data/input/corpus.jsonl".into(), is_directory: false })
        );
        assert_eq!(
            Location::parse("file:///data/output/dir/"),
            Ok(Location::Local { path: "/data/output/dir/".into(), is_directory: true })
        );
        assert!(Location::parse("file://host/data").is_err());
        assert!(Location::parse("file:relative").is_err());
    }

    #[test]
    fn s3_urls() {
        assert_eq!(
            Location::parse("s3://bucket/prefix/"),
            Ok(Location::S3 { bucket: "bucket".into(), key: "prefix/".into(), is_directory: true })
        );
        assert_eq!(
            Location::parse("s3://bucket/a/key.parquet"),
            Ok(Location::S3 { bucket: "bucket".into(), key: "a/key.parquet".into(), is_directory: false })
        );
        let whole_bucket = Location::parse("s3://bucket").unwrap();
        assert!(whole_bucket.is_directory());
        assert_eq!(whole_bucket, Location::S3 { bucket: "bucket".into(), key: String::new(), is_directory: true });
        assert!(Location::parse("s3:///key").is_err());
    }

    #[test]
    fn other_schemes_are_refused() {
        for bad in ["http://x/y", "/data/input", "gs://bucket/x", ""] {
            let error = Location::parse(bad).unwrap_err();
            assert!(error.contains("not a file:/// or s3:// URL"), "{error}");
        }
    }
}
