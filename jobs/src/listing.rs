//! The input objects: the one a URL names, or every object under its prefix, in path order. Every
//! worker lists the same store and so numbers the same shards.

use futures::TryStreamExt as _;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;

use crate::Error;
use crate::store::Store;

/// One input object and its size (all a JSONL plan needs of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputObject {
    pub path: Path,
    pub size: u64,
}

/// Lists the input. A URL without a trailing `/` names one object if there is one by that name,
/// else the prefix. Under a prefix, objects with any path segment starting with `.` or `_` are
/// left out (`_SUCCESS` markers, `.staging/` folders), and so are empty objects (folder markers
/// some S3 consoles create), which hold no rows.
pub async fn list_inputs(store: &Store) -> Result<Vec<InputObject>, Error> {
    let root = store.root();
    if !store.names_directory() {
        match store.objects().head(root).await {
            Ok(meta) => return Ok(vec![InputObject { path: meta.location, size: meta.size }]),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => return Err(store.error(root, source)),
        }
    }
    let prefix = (!root.as_ref().is_empty()).then_some(root);
    let listed: Vec<object_store::ObjectMeta> =
        store.objects().list(prefix).try_collect().await.map_err(|source| store.error(root, source))?;
    let mut objects: Vec<InputObject> = listed
        .into_iter()
        .filter(|meta| meta.size > 0 && !is_hidden(&meta.location, root))
        .map(|meta| InputObject { path: meta.location, size: meta.size })
        .collect();
    objects.sort_by(|a, b| a.path.as_ref().cmp(b.path.as_ref()));
    if objects.is_empty() {
        return Err(Error::NoInput { url: store.url_of(root) });
    }
    Ok(objects)
}

/// Whether a segment of `path` below `root` starts with `.` or `_`.
fn is_hidden(path: &Path, root: &Path) -> bool {
    match path.prefix_match(root) {
        Some(mut below) => below.any(|segment| segment.as_ref().starts_with(['.', '_'])),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::ObjectStore;
    use object_store::memory::InMemory;

    use super::*;

    async fn store_with(paths: &[(&str, usize)], root: &str, names_directory: bool) -> Store {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        for (path, size) in paths {
            objects.put(&Path::from(*path), vec![b'x'; *size].into()).await.unwrap();
        }
        Store::new(objects, Path::from(root), names_directory, "s3://bucket/")
    }

    fn names(objects: &[InputObject]) -> Vec<&str> {
        objects.iter().map(|object| object.path.as_ref()).collect()
    }

    #[tokio::test]
    async fn a_prefix_lists_visible_objects_in_path_order() {
        let store = store_with(
            &[
                ("in/b.jsonl", 3),
                ("in/a.jsonl", 2),
                ("in/_SUCCESS", 1),
                ("in/.hidden", 1),
                ("in/.staging/c.jsonl", 1),
                ("in/sub/c.jsonl", 4),
                ("in/empty.jsonl", 0),
                ("in2/other.jsonl", 1),
            ],
            "in",
            true,
        )
        .await;
        let objects = list_inputs(&store).await.unwrap();
        assert_eq!(names(&objects), ["in/a.jsonl", "in/b.jsonl", "in/sub/c.jsonl"]);
        assert_eq!(objects[1].size, 3);
    }

    #[tokio::test]
    async fn a_name_without_slash_is_the_object_or_else_a_prefix() {
        let store = store_with(&[("in/a.jsonl", 2), ("in/b.jsonl", 2)], "in/a.jsonl", false).await;
        assert_eq!(names(&list_inputs(&store).await.unwrap()), ["in/a.jsonl"]);
        let store = store_with(&[("in/a.jsonl", 2), ("in/b.jsonl", 2)], "in", false).await;
        assert_eq!(names(&list_inputs(&store).await.unwrap()), ["in/a.jsonl", "in/b.jsonl"]);
    }

    #[tokio::test]
    async fn nothing_to_read_is_an_error_naming_the_url() {
        let store = store_with(&[("in/_SUCCESS", 1)], "in", true).await;
        let error = list_inputs(&store).await.unwrap_err().to_string();
        assert!(error.starts_with("s3://bucket/in: no input objects"), "{error}");
    }
}
