//! Golden tests of the Deployment of a pool that asks for a share of a GPU: time-slicing, MPS
//! with the renamed resource, a MIG profile, and a model too large for its share (no pod). Run
//! with `UPDATE_GOLDEN=1` to rewrite the files after an intended change, then review the diff.

use std::path::PathBuf;

use k8s_openapi::api::apps::v1::Deployment;
use teifleet_crds::EmbeddingPool;
use teifleet_operator::render::{RenderConfig, render};

fn pool(gpu: &str, model: &str) -> EmbeddingPool {
    let yaml = format!(
        r#"
apiVersion: teifleet.dev/v1alpha1
kind: EmbeddingPool
metadata:
  name: small
  namespace: ml
  uid: 7d1c0f2e-0000-4000-8000-000000000034
  generation: 1
spec:
  model:
    id: {model}
  gpu: {gpu}
  replicas: 2
"#
    );
    serde_norway::from_str(&yaml).expect("fixture parses")
}

fn deployment(pool: &EmbeddingPool) -> Deployment {
    render(pool, &RenderConfig::default(), None).expect("renders").deployment
}

fn check(file: &str, deployment: &Deployment) {
    let rendered = serde_norway::to_string(deployment).expect("serializes");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &rendered).expect("writes golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "{} is missing; run UPDATE_GOLDEN=1 cargo test -p teifleet-operator --test golden_sharing",
            path.display()
        )
    });
    similar_asserts::assert_eq!(expected, rendered, "{file} differs; if intended, rerun with UPDATE_GOLDEN=1");
}

const SMALL_MODEL: &str = "BAAI/bge-small-en-v1.5";

#[test]
fn time_slicing_asks_for_a_replica_on_nodes_labelled_with_the_same_replicas() {
    let pool = pool("{type: nvidia-l4, sharing: {strategy: time-slicing, replicas: 4}}", SMALL_MODEL);
    check("deployment-sharing-time-slicing.yaml", &deployment(&pool));
}

#[test]
fn mps_with_the_renamed_resource_asks_for_nvidia_com_gpu_shared() {
    let pool =
        pool("{type: nvidia-h100-80gb, sharing: {strategy: mps, replicas: 7, renameByDefault: true}}", SMALL_MODEL);
    check("deployment-sharing-mps.yaml", &deployment(&pool));
}

#[test]
fn mig_asks_for_the_profile_on_mixed_strategy_nodes_offering_it() {
    let pool = pool("{type: nvidia-a100-80gb, sharing: {strategy: mig, profile: 1g.10gb}}", SMALL_MODEL);
    check("deployment-sharing-mig.yaml", &deployment(&pool));
}

#[test]
fn a_model_too_large_for_its_share_gets_no_pod() {
    let too_big = pool("{type: nvidia-l4, sharing: {strategy: time-slicing, replicas: 4}}", "Qwen/Qwen3-Embedding-8B");
    assert_eq!(deployment(&too_big).spec.unwrap().replicas, Some(0));
    let fits = pool("{type: nvidia-l4, sharing: {strategy: time-slicing, replicas: 2}}", "Qwen/Qwen3-Embedding-4B");
    assert_eq!(deployment(&fits).spec.unwrap().replicas, Some(2), "4B in float16 fits half an L4");
    let mut declared = pool("{type: nvidia-l4, sharing: {strategy: time-slicing, replicas: 4}}", "my-org/private");
    assert_eq!(deployment(&declared).spec.unwrap().replicas, Some(2), "an unknown model is not judged");
    declared.spec.model.gpu_memory = Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity("6Gi".into()));
    assert_eq!(deployment(&declared).spec.unwrap().replicas, Some(0), "6 GiB declared, 5.6 GiB given");
}

#[test]
fn the_tei_image_still_follows_the_architecture() {
    for (gpu, tag) in [
        ("{type: nvidia-l4, sharing: {strategy: time-slicing, replicas: 4}}", "89-1.9-grpc"),
        ("{type: nvidia-h200, sharing: {strategy: mig, profile: 1g.18gb}}", "hopper-1.9-grpc"),
        ("{type: nvidia-a100-40gb, sharing: {strategy: mig, profile: 1g.5gb}}", "1.9-grpc"),
    ] {
        let deployment = deployment(&pool(gpu, SMALL_MODEL));
        let image = deployment.spec.unwrap().template.spec.unwrap().containers[0].image.clone().unwrap();
        assert!(image.ends_with(&format!(":{tag}")), "{gpu}: {image}");
    }
}
