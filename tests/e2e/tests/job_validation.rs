//! The real API server refuses EmbeddingJobs that would act through the operator, with messages a
//! person understands: worker pods labelled as a pool's (or the activator's, or another Job's)
//! pods, confinement annotations, and an image of the job's own beside the claims and Secrets the
//! workers mount. Only the API server is needed: every request is a dry run.

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};
use teifleet_crds::EmbeddingJob;
use teifleet_e2e::{admin_client, repo_root, test_namespace};

fn job(spec_extra: Value) -> DynamicObject {
    let mut spec = json!({
        "poolRef": { "name": "bge" },
        "input": { "store": { "pvc": { "claimName": "corpus" } } },
        "output": { "store": { "s3": {
            "bucket": "vectors", "endpoint": "https://s3.example.com", "credentialsSecret": "s3"
        } } },
    });
    for (key, value) in spec_extra.as_object().cloned().unwrap_or_default() {
        spec[key] = value;
    }
    serde_json::from_value(json!({
        "apiVersion": "teifleet.dev/v1alpha1",
        "kind": "EmbeddingJob",
        "metadata": { "name": "reindex" },
        "spec": spec,
    }))
    .unwrap()
}

#[tokio::test]
async fn jobs_that_would_act_through_the_operator_are_refused_in_words() {
    let client = admin_client().await;
    let crd = repo_root().join("crds/teifleet.dev_embeddingjobs.yaml");
    teifleet_testkit::kube::install_crd(&client, &crd, "teifleet-e2e").await.expect("the job CRD installs");
    let ns = test_namespace("job-crd").await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &ApiResource::erase::<EmbeddingJob>(&()));
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };

    let accepted = job(json!({ "template": {
        "labels": { "team": "search", "app.kubernetes.io/version": "3" },
        "annotations": { "example.com/owner": "search" },
    } }));
    api.create(&dry_run, &accepted).await.expect("labels and annotations of the creator's own are accepted");
    // A batch of OpenAI's Batch API, as teifleet-batch creates it: its file and its output on one claim.
    let openai_batch = job(json!({
        "input": {
            "store": { "pvc": { "claimName": "teifleet-batch", "path": "batch" } },
            "path": "files/file-0123456789abcdef01234567/content",
            "format": "openaiBatch",
        },
        "output": { "store": { "pvc": { "claimName": "teifleet-batch", "path": "batch/batches/batch_0123456789abcdef01234567/" } } },
        "deadline": "24h",
    }));
    api.create(&dry_run, &openai_batch).await.expect("input.format openaiBatch is accepted");

    let labels = "template.labels must not set the labels that make a pod a pool's, the activator's or the Job's own";
    let annotations = "template.annotations must not set teifleet's, the Job controller's or the pods' confinement";
    let image = "image cannot be set on a job whose workers mount a claim or a Secret";
    let cases = [
        (
            json!({ "input": { "store": { "pvc": { "claimName": "corpus" } }, "format": "openai-batch" } }),
            "Unsupported value: \"openai-batch\"",
        ),
        (json!({ "template": { "labels": { "teifleet.dev/pool": "bge" } } }), labels),
        (json!({ "template": { "labels": { "x.teifleet.dev/pool": "bge" } } }), labels),
        (json!({ "template": { "labels": { "app.kubernetes.io/component": "activator" } } }), labels),
        (json!({ "template": { "labels": { "job-name": "other" } } }), labels),
        (json!({ "template": { "annotations": { "teifleet.dev/pool": "bge" } } }), annotations),
        (
            json!({ "template": { "annotations": { "container.apparmor.security.beta.kubernetes.io/worker": "unconfined" } } }),
            annotations,
        ),
        (json!({ "image": "registry.example.com/reader:1" }), image),
        (json!({ "image": "registry.example.com/reader:1", "apiKeySecret": { "name": "keys", "key": "k" } }), image),
    ];
    for (extra, message) in cases {
        let refused = api.create(&dry_run, &job(extra.clone())).await;
        let error = refused.expect_err(&format!("{extra} is refused")).to_string();
        assert!(error.contains(message), "{extra}: {error}");
    }
}
