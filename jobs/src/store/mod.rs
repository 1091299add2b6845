//! The input and output stores: a local volume or an S3-compatible bucket behind object_store, and
//! the place inside it the flag's URL points at.

pub mod http;
pub mod location;
pub mod parquet_reader;
pub mod s3;

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path;

pub use location::Location;
pub use s3::{S3Credentials, S3Settings, StoreRole};

use crate::Error;

/// A store and where in it a `--input` or `--output` URL points.
#[derive(Debug, Clone)]
pub struct Store {
    objects: Arc<dyn ObjectStore>,
    root: Path,
    names_directory: bool,
    /// Written before a path to make it a URL again in messages: `file:///` or `s3://bucket/`.
    url_base: String,
}

impl Store {
    /// Opens the store a URL names. Local files are written with fsync: resuming trusts that an
    /// output which exists is complete, and after a node's crash an unsynced rename could leave
    /// an empty file in its place.
    pub fn open(role: StoreRole, url: &str, s3: &S3Settings) -> Result<Self, Error> {
        let location = Location::parse(url).map_err(|reason| Error::flag(role.flag(), reason))?;
        let names_directory = location.is_directory();
        let store_error = |source| Error::Store { url: url.to_owned(), source };
        match location {
            Location::Local { path, .. } => {
                let root = Path::from_absolute_path(&path).map_err(|source| store_error(source.into()))?;
                let objects = Arc::new(LocalFileSystem::new().with_fsync(true));
                Ok(Self { objects, root, names_directory, url_base: "file:///".to_owned() })
            }
            Location::S3 { bucket, key, .. } => {
                let objects = s3.open(&bucket).map_err(store_error)?;
                Ok(Self { objects, root: Path::from(key), names_directory, url_base: format!("s3://{bucket}/") })
            }
        }
    }

    /// A store over any object_store implementation (tests use the in-memory one).
    pub fn new(objects: Arc<dyn ObjectStore>, root: Path, names_directory: bool, url_base: &str) -> Self {
        Self { objects, root, names_directory, url_base: url_base.to_owned() }
    }

    pub fn objects(&self) -> &Arc<dyn ObjectStore> {
        &self.objects
    }

    /// Where the URL points: one object, or the prefix of many.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the URL ended in `/`, so it can only be a prefix.
    pub fn names_directory(&self) -> bool {
        self.names_directory
    }

    /// A path in this store as a URL, for messages.
    pub fn url_of(&self, path: &Path) -> String {
        format!("{}{path}", self.url_base)
    }

    /// A failed store operation on `path`, naming it.
    pub fn error(&self, path: &Path, source: object_store::Error) -> Error {
        Error::Store { url: self.url_of(path), source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_map_to_stores_and_back() {
        let local = Store::open(StoreRole::Input, "file:///data/input/corpus.jsonl", &S3Settings::default()).unwrap();
        assert_eq!(local.root().as_ref(), "data/input/corpus.jsonl");
        assert!(!local.names_directory());
        assert_eq!(local.url_of(local.root()), "file:///data/input/corpus.jsonl");

        let s3 = Store::open(StoreRole::Output, "s3://bucket/prefix/", &S3Settings::default()).unwrap();
        assert_eq!(s3.root().as_ref(), "prefix");
        assert!(s3.names_directory());
        assert_eq!(s3.url_of(&s3.root().clone().join("part-000001.parquet")), "s3://bucket/prefix/part-000001.parquet");
    }

    #[test]
    fn a_bad_url_names_the_flag() {
        let error = Store::open(StoreRole::Output, "ftp://x/y", &S3Settings::default()).unwrap_err().to_string();
        assert_eq!(error, "--output: \"ftp://x/y\": not a file:/// or s3:// URL");
    }
}
