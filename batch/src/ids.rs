//! Object ids. Each one becomes a path component in the store and a Kubernetes name, so its shape
//! is checked before anything touches a path: `file-` or `batch_` and 24 lowercase hex digits,
//! nothing else (`file-../../x` is a file that does not exist, not a path).

/// Hex digits in every id: 96 random bits.
const HEX_DIGITS: usize = 24;

pub const FILE_PREFIX: &str = "file-";
pub const BATCH_PREFIX: &str = "batch_";
/// A batch's output and error files: `<batch_id>-output`, `<batch_id>-errors`.
pub const OUTPUT_SUFFIX: &str = "-output";
pub const ERRORS_SUFFIX: &str = "-errors";

/// A file id the API accepts: an uploaded file, or one of a batch's result files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileId {
    /// `file-<hex>`: an upload, under `files/<id>/`.
    Upload(String),
    /// `batch_<hex>-output`: the batch's output parts concatenated.
    Output(BatchId),
    /// `batch_<hex>-errors`: the batch's error parts concatenated.
    Errors(BatchId),
}

impl FileId {
    /// The id, if `text` has an id's shape.
    pub fn parse(text: &str) -> Option<Self> {
        if let Some(hex) = text.strip_prefix(FILE_PREFIX) {
            return is_hex(hex).then(|| Self::Upload(text.to_owned()));
        }
        if let Some(batch) = text.strip_suffix(OUTPUT_SUFFIX) {
            return BatchId::parse(batch).map(Self::Output);
        }
        if let Some(batch) = text.strip_suffix(ERRORS_SUFFIX) {
            return BatchId::parse(batch).map(Self::Errors);
        }
        None
    }

    /// A new upload's id.
    pub fn new_upload() -> String {
        format!("{FILE_PREFIX}{}", random_hex())
    }
}

/// A batch id: `batch_<24 hex>`; its EmbeddingJob is `batch-<same hex>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchId(String);

impl BatchId {
    pub fn parse(text: &str) -> Option<Self> {
        let hex = text.strip_prefix(BATCH_PREFIX)?;
        is_hex(hex).then(|| Self(text.to_owned()))
    }

    pub fn new_random() -> Self {
        Self(format!("{BATCH_PREFIX}{}", random_hex()))
    }

    /// The batch of a job name made by [`Self::job_name`].
    pub fn from_job_name(name: &str) -> Option<Self> {
        Self::parse(&format!("{BATCH_PREFIX}{}", name.strip_prefix("batch-")?))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The EmbeddingJob's name: a DNS label (`_` is not allowed in one).
    pub fn job_name(&self) -> String {
        format!("batch-{}", &self.0[BATCH_PREFIX.len()..])
    }

    pub fn output_file_id(&self) -> String {
        format!("{}{OUTPUT_SUFFIX}", self.0)
    }

    pub fn errors_file_id(&self) -> String {
        format!("{}{ERRORS_SUFFIX}", self.0)
    }
}

impl std::fmt::Display for BatchId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_hex(text: &str) -> bool {
    text.len() == HEX_DIGITS && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// 96 bits from the operating system, as 24 lowercase hex digits.
fn random_hex() -> String {
    let mut bytes = [0u8; HEX_DIGITS / 2];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_shapes_are_ids() {
        let hex = "0123456789abcdef01234567";
        assert_eq!(FileId::parse(&format!("file-{hex}")), Some(FileId::Upload(format!("file-{hex}"))));
        let batch = BatchId::parse(&format!("batch_{hex}")).unwrap();
        assert_eq!(FileId::parse(&format!("batch_{hex}-output")), Some(FileId::Output(batch.clone())));
        assert_eq!(FileId::parse(&format!("batch_{hex}-errors")), Some(FileId::Errors(batch.clone())));
        assert_eq!(batch.job_name(), format!("batch-{hex}"));
        assert_eq!(BatchId::from_job_name(&batch.job_name()), Some(batch));
        for bad in [
            "file-../../x",
            "file-0123456789ABCDEF01234567",
            "file-0123456789abcdef0123456",
            "file-0123456789abcdef012345678",
            "file-0123456789abcdef0123456g",
            "file-0123456789abcdef01234567/",
            "batch_0123456789abcdef01234567",
            "batch_../0123456789abcdef0123-output",
            "",
        ] {
            assert_eq!(FileId::parse(bad), None, "{bad}");
        }
        assert_eq!(BatchId::parse("batch_0123456789abcdef01234567/.."), None);
        assert_eq!(BatchId::from_job_name("reindex"), None);
    }

    #[test]
    fn new_ids_have_the_shape() {
        let id = FileId::new_upload();
        assert!(matches!(FileId::parse(&id), Some(FileId::Upload(_))), "{id}");
        assert_ne!(id, FileId::new_upload());
        assert!(BatchId::parse(BatchId::new_random().as_str()).is_some());
    }
}
