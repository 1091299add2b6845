//! Prints a CustomResourceDefinition as YAML (`make generate` writes each to disk):
//! `crdgen [embeddingpools|embeddingjobs]`, EmbeddingPool's without an argument.
use kube::CustomResourceExt;
use teifleet_crds::{EmbeddingJob, EmbeddingPool};

fn main() {
    let which = std::env::args().nth(1);
    let crd = match which.as_deref() {
        None | Some("embeddingpools") => EmbeddingPool::crd(),
        Some("embeddingjobs") => EmbeddingJob::crd(),
        Some(other) => {
            eprintln!("crdgen: no CRD named {other:?}; expected embeddingpools or embeddingjobs");
            std::process::exit(2);
        }
    };
    print!("{}", serde_norway::to_string(&crd).expect("the CRD serializes to YAML"));
}
