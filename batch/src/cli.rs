//! `teifleet-batch`'s flags, and the store and job defaults they make.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::ArgAction;
use teifleet_crds::job::WorkerPodOverrides;
use teifleet_job::size::parse_bytes;
use teifleet_job::store::{Location, S3Credentials, S3Settings, Store, StoreRole};

use crate::state::{JobDefaults, JobStore, Limits};
use crate::store::FileStore;
use crate::{Error, Result};

/// The store's S3 access key, from the environment (a Secret's keys); `AWS_*` as a fallback.
pub const ACCESS_KEY_ID_VARIABLES: [&str; 2] = ["TEIFLEET_STORE_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"];
pub const SECRET_ACCESS_KEY_VARIABLES: [&str; 2] = ["TEIFLEET_STORE_S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"];

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address the API listens on.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// The namespace the batches' EmbeddingJobs are created in, beside their pools.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// The store, as `teifleet-job --input` takes it: file:///data/batch/ (a mounted claim) or
    /// s3://bucket/prefix/.
    #[arg(long)]
    pub store: String,
    /// With a file:// store: the claim mounted there, which the jobs mount too.
    #[arg(long)]
    pub store_pvc_claim: Option<String>,
    /// With a file:// store: the directory within the claim that the store URL points at.
    #[arg(long, default_value = "")]
    pub store_pvc_path: String,
    #[arg(long)]
    pub store_s3_endpoint: Option<String>,
    #[arg(long, default_value = "us-east-1")]
    pub store_s3_region: String,
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub store_s3_allow_http: bool,
    /// With an s3:// store: the Secret (keys accessKeyId, secretAccessKey) the jobs' workers read
    /// the store with.
    #[arg(long)]
    pub store_s3_credentials_secret: Option<String>,
    /// A directory of files, each named for a tenant and holding its API keys, one a line (a
    /// mounted Secret). Unset: no key is asked for and every caller is the tenant `default`.
    #[arg(long)]
    pub api_keys_dir: Option<PathBuf>,
    /// Workers of each batch's EmbeddingJob.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(i32).range(1..=64))]
    pub workers: i32,
    /// Largest upload (OpenAI's Batch API: 200 MB).
    #[arg(long, default_value = "200M", value_parser = parse_bytes)]
    pub max_file_bytes: u64,
    /// Most requests in one batch input file (OpenAI's: 50,000).
    #[arg(long, default_value_t = 50_000)]
    pub max_requests: u64,
    /// Uploads streamed at once; one more is answered 429.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_uploads: u32,
    /// For pools with `spec.auth`: a Secret in the namespace holding an API key the batches'
    /// workers call the pools with (its data key in --job-api-key-secret-key).
    #[arg(long)]
    pub job_api_key_secret: Option<String>,
    #[arg(long, default_value = "key")]
    pub job_api_key_secret_key: String,
    /// The batches' worker pods: an EmbeddingJob's `spec.template` as JSON (nodeSelector,
    /// tolerations, affinity, resources, priorityClassName, labels, annotations), validated at
    /// start. Without it the workers go wherever the scheduler puts them.
    #[arg(long, value_parser = parse_job_template)]
    pub job_template: Option<WorkerPodOverrides>,
    /// Longest an upload may send nothing before it is dropped (408), such as 60s.
    #[arg(long, default_value = "60s", value_parser = teifleet_runtime::duration::parse_flag)]
    pub upload_idle_timeout: Duration,
}

/// `--job-template`: JSON of the EmbeddingJob's worker template. A field it does not know is
/// refused, so a misspelt one is an error at start, not a worker in the wrong place.
fn parse_job_template(json: &str) -> std::result::Result<WorkerPodOverrides, String> {
    let given: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(json).map_err(|e| format!("not a JSON object: {e}"))?;
    let template: WorkerPodOverrides = serde_json::from_value(serde_json::Value::Object(given.clone()))
        .map_err(|e| format!("not an EmbeddingJob spec.template: {e}"))?;
    let known = serde_json::to_value(&template).map_err(|e| e.to_string())?;
    let unknown: Vec<&str> = given.keys().filter(|k| known.get(k.as_str()).is_none()).map(String::as_str).collect();
    match unknown.is_empty() {
        true => Ok(template),
        false => Err(format!("fields an EmbeddingJob spec.template does not have: {}", unknown.join(", "))),
    }
}

impl Args {
    pub fn limits(&self) -> Limits {
        Limits {
            max_file_bytes: self.max_file_bytes,
            max_requests: self.max_requests,
            max_uploads: self.max_uploads as usize,
            upload_idle: self.upload_idle_timeout,
        }
    }

    /// The store, and the same store as the jobs' specs name it. `environment` looks up the S3
    /// credential variables.
    pub fn store(&self, environment: impl Fn(&str) -> Option<String>) -> Result<(FileStore, JobDefaults)> {
        let lookup = |names: [&str; 2]| names.iter().find_map(|name| environment(name).filter(|v| !v.is_empty()));
        let credentials = match (lookup(ACCESS_KEY_ID_VARIABLES), lookup(SECRET_ACCESS_KEY_VARIABLES)) {
            (Some(access_key_id), Some(secret_access_key)) => Some(S3Credentials { access_key_id, secret_access_key }),
            (None, None) => None,
            _ => return Err(Error::Flag { flag: "store", reason: "only half of the S3 access key is set".into() }),
        };
        let s3 = S3Settings {
            endpoint: self.store_s3_endpoint.clone(),
            region: self.store_s3_region.clone(),
            allow_http: self.store_s3_allow_http,
            credentials,
        };
        let location = Location::parse(&self.store).map_err(|reason| Error::Flag { flag: "store", reason })?;
        let job_store = match location {
            Location::Local { .. } => {
                let claim = self.store_pvc_claim.clone().ok_or_else(|| Error::Flag {
                    flag: "store-pvc-claim",
                    reason: "a file:// store needs the claim it is on, for the jobs to mount".into(),
                })?;
                JobStore::Pvc { claim, path: self.store_pvc_path.trim_matches('/').to_owned() }
            }
            Location::S3 { bucket, key, .. } => JobStore::S3 {
                key: key.trim_matches('/').to_owned(),
                endpoint: self
                    .store_s3_endpoint
                    .clone()
                    .unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", self.store_s3_region)),
                region: self.store_s3_region.clone(),
                credentials_secret: self.store_s3_credentials_secret.clone().ok_or_else(|| Error::Flag {
                    flag: "store-s3-credentials-secret",
                    reason: "an s3:// store needs the Secret the jobs' workers read it with".into(),
                })?,
                allow_http: self.store_s3_allow_http,
                bucket,
            },
        };
        // The store is a directory, whether or not its URL ends in `/`.
        let url = if self.store.ends_with('/') { self.store.clone() } else { format!("{}/", self.store) };
        let store = Store::open(StoreRole::Input, &url, &s3)?;
        let api_key_secret = self.job_api_key_secret.clone().map(|name| (name, self.job_api_key_secret_key.clone()));
        let template = self.job_template.clone();
        Ok((FileStore::new(store), JobDefaults { store: job_store, workers: self.workers, api_key_secret, template }))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        args: Args,
    }

    fn parse(args: &[&str]) -> Args {
        Command::try_parse_from(["teifleet-batch", "--namespace=ml"].iter().chain(args)).unwrap().args
    }

    #[test]
    fn defaults_are_openais_limits() {
        let args = parse(&["--store=file:///data/batch/", "--store-pvc-claim=batch"]);
        assert_eq!(args.limits(), Limits::default());
        assert_eq!((args.listen.port(), args.workers), (8080, 2));
        let (_, jobs) = args.store(|_| None).unwrap();
        assert_eq!(jobs.store, JobStore::Pvc { claim: "batch".into(), path: String::new() });
    }

    #[test]
    fn an_s3_store_names_its_bucket_key_and_secret_for_the_jobs() {
        let args = parse(&[
            "--store=s3://batches/api",
            "--store-s3-endpoint=http://seaweedfs:8333",
            "--store-s3-allow-http",
            "--store-s3-credentials-secret=batch-s3",
        ]);
        let env = |name: &str| match name {
            "TEIFLEET_STORE_S3_ACCESS_KEY_ID" => Some("id".to_owned()),
            "AWS_SECRET_ACCESS_KEY" => Some("secret".to_owned()),
            _ => None,
        };
        let (store, jobs) = args.store(env).unwrap();
        assert_eq!(store.store().root().as_ref(), "api");
        assert_eq!(
            jobs.store,
            JobStore::S3 {
                bucket: "batches".into(),
                key: "api".into(),
                endpoint: "http://seaweedfs:8333".into(),
                region: "us-east-1".into(),
                credentials_secret: "batch-s3".into(),
                allow_http: true,
            }
        );
        let half = |name: &str| (name == "AWS_ACCESS_KEY_ID").then(|| "id".to_owned());
        assert!(args.store(half).is_err());
        assert!(parse(&["--store=s3://b/"]).store(|_| None).is_err(), "the jobs need the Secret");
        assert!(parse(&["--store=file:///data/"]).store(|_| None).is_err(), "the jobs need the claim");
        assert!(Command::try_parse_from(["x", "--namespace=ml", "--store=s3://b/", "--workers=0"]).is_err());
        let template = |json: &str| Command::try_parse_from(["x", "--namespace=ml", "--store=s3://b/", json]);
        let parsed =
            template(r#"--job-template={"nodeSelector":{"a":"b"},"tolerations":[{"key":"k","operator":"Exists"}]}"#);
        let parsed = parsed.unwrap().args.job_template.unwrap();
        assert_eq!((parsed.node_selector["a"].as_str(), parsed.tolerations.len()), ("b", 1));
        let error = template(r#"--job-template={"nodeSelecter":{"a":"b"}}"#).err().unwrap().to_string();
        assert!(error.contains("does not have: nodeSelecter"), "{error}");
        assert!(template("--job-template=[1]").is_err());
    }
}
