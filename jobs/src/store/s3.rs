//! S3-compatible stores (AWS, SeaweedFS, MinIO): the endpoint and region flags, credentials from
//! the environment, path-style requests through [`super::http::HyperConnector`].

use std::fmt;
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;

use super::http::HyperConnector;
use crate::Error;

/// Which side of the job a store serves: each has its own flags and credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreRole {
    Input,
    Output,
}

impl StoreRole {
    /// The flag whose URL names this side's store.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Input => "input",
            Self::Output => "output",
        }
    }

    /// The environment variables holding this side's access key id and secret.
    pub fn credential_variables(self) -> (&'static str, &'static str) {
        match self {
            Self::Input => ("TEIFLEET_INPUT_S3_ACCESS_KEY_ID", "TEIFLEET_INPUT_S3_SECRET_ACCESS_KEY"),
            Self::Output => ("TEIFLEET_OUTPUT_S3_ACCESS_KEY_ID", "TEIFLEET_OUTPUT_S3_SECRET_ACCESS_KEY"),
        }
    }
}

/// A static access key. Its `Debug` leaves the secret out, so it never reaches a log.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Credentials").field("access_key_id", &self.access_key_id).finish_non_exhaustive()
    }
}

impl S3Credentials {
    /// Reads a side's credentials through `lookup` (the process environment in the binary). Both
    /// or neither must be set: one alone is a mistake in the Secret, better said than signed
    /// wrong.
    pub fn from_env(role: StoreRole, lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, Error> {
        let (id_variable, secret_variable) = role.credential_variables();
        let non_empty = |name: &str| lookup(name).filter(|value| !value.is_empty());
        match (non_empty(id_variable), non_empty(secret_variable)) {
            (Some(access_key_id), Some(secret_access_key)) => Ok(Some(Self { access_key_id, secret_access_key })),
            (None, None) => Ok(None),
            (Some(_), None) => Err(Error::Credentials(format!("{id_variable} is set but {secret_variable} is not"))),
            (None, Some(_)) => Err(Error::Credentials(format!("{secret_variable} is set but {id_variable} is not"))),
        }
    }
}

/// How to reach one side's S3-compatible store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Settings {
    /// `http(s)://host:port` of an S3-compatible server; none: AWS's endpoint for the region.
    pub endpoint: Option<String>,
    pub region: String,
    /// Whether a plain `http://` endpoint is allowed.
    pub allow_http: bool,
    /// None: requests go unsigned (public buckets).
    pub credentials: Option<S3Credentials>,
}

impl Default for S3Settings {
    fn default() -> Self {
        Self { endpoint: None, region: "us-east-1".to_owned(), allow_http: false, credentials: None }
    }
}

impl S3Settings {
    /// The builder for `bucket`, with everything these settings say. Kept apart from
    /// [`Self::open`] so tests can read back what was configured.
    pub fn builder(&self, bucket: &str) -> AmazonS3Builder {
        // `new`, not `from_env`: the job's own flags and variables are the only configuration,
        // so an AWS_* variable in the pod cannot redirect a job.
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(&self.region)
            .with_allow_http(self.allow_http)
            // Path-style (`endpoint/bucket/key`): what SeaweedFS and MinIO serve without
            // wildcard DNS.
            .with_virtual_hosted_style_request(false)
            .with_http_connector(HyperConnector);
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        match &self.credentials {
            Some(credentials) => builder
                .with_access_key_id(&credentials.access_key_id)
                .with_secret_access_key(&credentials.secret_access_key),
            None => builder.with_skip_signature(true),
        }
    }

    /// Opens `bucket`. Nothing is sent yet: a wrong endpoint or key shows on the first request.
    pub fn open(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
        if let Some(endpoint) = &self.endpoint
            && endpoint.starts_with("http://")
            && !self.allow_http
        {
            return Err(object_store::Error::Generic {
                store: "S3",
                source: format!("endpoint {endpoint} is plain HTTP: pass --*-s3-allow-http to allow it").into(),
            });
        }
        Ok(Arc::new(self.builder(bucket).build()?))
    }
}

#[cfg(test)]
mod tests {
    use object_store::aws::AmazonS3ConfigKey;

    use super::*;

    fn environment(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| pairs.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone())
    }

    #[test]
    fn credentials_come_from_each_sides_variables() {
        let env = environment(&[
            ("TEIFLEET_INPUT_S3_ACCESS_KEY_ID", "in-id"),
            ("TEIFLEET_INPUT_S3_SECRET_ACCESS_KEY", "in-secret"),
            ("TEIFLEET_OUTPUT_S3_ACCESS_KEY_ID", "out-id"),
            ("TEIFLEET_OUTPUT_S3_SECRET_ACCESS_KEY", "out-secret"),
        ]);
        let input = S3Credentials::from_env(StoreRole::Input, &env).unwrap().unwrap();
        let output = S3Credentials::from_env(StoreRole::Output, &env).unwrap().unwrap();
        assert_eq!((input.access_key_id.as_str(), input.secret_access_key.as_str()), ("in-id", "in-secret"));
        assert_eq!((output.access_key_id.as_str(), output.secret_access_key.as_str()), ("out-id", "out-secret"));
        assert!(!format!("{input:?}").contains("in-secret"), "the secret stays out of Debug");
        assert_eq!(S3Credentials::from_env(StoreRole::Input, environment(&[])).unwrap(), None);
    }

    #[test]
    fn half_a_key_is_refused() {
        let env = environment(&[("TEIFLEET_OUTPUT_S3_ACCESS_KEY_ID", "id")]);
        let error = S3Credentials::from_env(StoreRole::Output, env).unwrap_err().to_string();
        assert!(
            error.ends_with("TEIFLEET_OUTPUT_S3_ACCESS_KEY_ID is set but TEIFLEET_OUTPUT_S3_SECRET_ACCESS_KEY is not"),
            "{error}"
        );
    }

    #[test]
    fn the_builder_carries_every_setting() {
        let settings = S3Settings {
            endpoint: Some("http://seaweedfs.storage.svc:8333".into()),
            region: "eu-west-3".into(),
            allow_http: true,
            credentials: Some(S3Credentials { access_key_id: "id".into(), secret_access_key: "secret".into() }),
        };
        let builder = settings.builder("corpus");
        let value = |key| builder.get_config_value(&key);
        assert_eq!(value(AmazonS3ConfigKey::Bucket).as_deref(), Some("corpus"));
        assert_eq!(value(AmazonS3ConfigKey::Region).as_deref(), Some("eu-west-3"));
        assert_eq!(value(AmazonS3ConfigKey::Endpoint).as_deref(), Some("http://seaweedfs.storage.svc:8333"));
        assert_eq!(value(AmazonS3ConfigKey::VirtualHostedStyleRequest).as_deref(), Some("false"));
        assert_eq!(value(AmazonS3ConfigKey::AccessKeyId).as_deref(), Some("id"));
        assert_eq!(value(AmazonS3ConfigKey::SecretAccessKey).as_deref(), Some("secret"));
        assert!(settings.open("corpus").is_ok());

        let anonymous = S3Settings::default().builder("public");
        assert_eq!(anonymous.get_config_value(&AmazonS3ConfigKey::SkipSignature).as_deref(), Some("true"));
    }

    #[test]
    fn a_plain_http_endpoint_needs_allow_http() {
        let settings = S3Settings { endpoint: Some("http://minio:9000".into()), ..S3Settings::default() };
        let error = settings.open("bucket").unwrap_err().to_string();
        assert!(error.contains("allow-http"), "{error}");
    }
}
