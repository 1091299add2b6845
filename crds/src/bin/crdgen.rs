//! Prints the EmbeddingPool CustomResourceDefinition as YAML (`make generate` writes it to disk).
use kube::CustomResourceExt;

fn main() {
    let crd = teifleet_crds::EmbeddingPool::crd();
    print!("{}", serde_norway::to_string(&crd).expect("the CRD serializes to YAML"));
}
