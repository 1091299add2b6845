//! teifleet's embedding-job runner (issue 33): one worker of an `EmbeddingJob`.
#![forbid(unsafe_code)]
