//! API keys and the tenant each one names. With `--api-keys-dir` (a mounted Secret shaped like a
//! pool's `spec.auth` Secret): each file is a tenant, named by the file, whose content is that
//! tenant's keys, one a line. The directory is read again every second, so a key added to or
//! taken from the Secret works or stops working without a restart. Without the flag the API is
//! open and every caller is the tenant `default`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode, header};
use subtle::ConstantTimeEq;

use crate::{Error, Result};

/// The tenant of every caller when no keys are configured.
pub const DEFAULT_TENANT: &str = "default";

/// Shortest key taken: a shorter one is too easy to guess, and is left out with a warning.
pub const MIN_KEY_LENGTH: usize = 16;

/// How often the directory is read again.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// One key and its tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    key: String,
    tenant: String,
}

/// Who may call, and as which tenant.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    /// None: the API is open (no `--api-keys-dir`).
    entries: Option<Arc<RwLock<Vec<Entry>>>>,
}

impl Keys {
    /// An open API: every caller is [`DEFAULT_TENANT`].
    pub fn open_to_all() -> Self {
        Self { entries: None }
    }

    /// The keys in `dir`, read now and then every `every` by a task on the current runtime.
    pub fn watch(dir: PathBuf, every: Duration) -> Result<Self> {
        let entries = Arc::new(RwLock::new(read_dir(&dir)?));
        let watched = Arc::downgrade(&entries);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                // Ends when the server (the last holder of the keys) is gone.
                let Some(entries) = watched.upgrade() else { return };
                match read_dir(&dir) {
                    Ok(fresh) => {
                        let mut current = entries.write().unwrap_or_else(|poisoned| poisoned.into_inner());
                        if *current != fresh {
                            tracing::info!(keys = fresh.len(), "API keys changed");
                            *current = fresh;
                        }
                    }
                    // A Secret being swapped can be caught half-way: keep the keys there were.
                    Err(error) => tracing::warn!(%error, "API keys not reloaded"),
                }
            }
        });
        Ok(Self { entries: Some(entries) })
    }

    /// The caller's tenant, from `authorization: Bearer <key>`.
    pub fn tenant(&self, headers: &HeaderMap) -> Result<String> {
        let Some(entries) = &self.entries else { return Ok(DEFAULT_TENANT.to_owned()) };
        let Some(key) = bearer(headers) else {
            return Err(Error::api(
                StatusCode::UNAUTHORIZED,
                "You didn't provide an API key. You need to provide your API key in an Authorization header \
                 using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                None,
                None,
            ));
        };
        let entries = entries.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Every key compared in constant time, all of them, so the time taken says nothing of
        // how much of a guess was right.
        let mut found = None;
        for entry in entries.iter() {
            if bool::from(entry.key.as_bytes().ct_eq(key.as_bytes())) {
                found = Some(entry.tenant.clone());
            }
        }
        found.ok_or_else(|| {
            Error::api(StatusCode::UNAUTHORIZED, "Incorrect API key provided.", None, Some("invalid_api_key"))
        })
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}

/// Every tenant file's keys. Names starting with `.` are skipped (a mounted Secret's `..data`
/// links); a key two tenants share is ambiguous and dropped from both.
fn read_dir(dir: &Path) -> Result<Vec<Entry>> {
    let io = |source| Error::Keys { path: dir.display().to_string(), source };
    let mut entries = Vec::new();
    for item in std::fs::read_dir(dir).map_err(io)? {
        let item = item.map_err(io)?;
        let Ok(tenant) = item.file_name().into_string() else { continue };
        // Follows links: a Secret's files are links into its current `..data`.
        if tenant.starts_with('.') || !std::fs::metadata(item.path()).map_err(io)?.is_file() {
            continue;
        }
        if !is_label_value(&tenant) {
            tracing::warn!(%tenant, "tenant skipped: its name must be a Kubernetes label value (it labels the tenant's jobs)");
            continue;
        }
        let content = std::fs::read_to_string(item.path()).map_err(io)?;
        for key in content.lines().map(str::trim).filter(|key| !key.is_empty()) {
            if key.len() < MIN_KEY_LENGTH {
                tracing::warn!(%tenant, "a key shorter than {MIN_KEY_LENGTH} characters is skipped");
                continue;
            }
            entries.push(Entry { key: key.to_owned(), tenant: tenant.clone() });
        }
    }
    let shared: Vec<String> = entries
        .iter()
        .filter(|entry| entries.iter().any(|other| other.key == entry.key && other.tenant != entry.tenant))
        .map(|entry| entry.tenant.clone())
        .collect();
    if !shared.is_empty() {
        tracing::warn!(tenants = ?shared, "a key given to more than one tenant is skipped");
        let keys: Vec<Entry> = entries.clone();
        entries.retain(|entry| !keys.iter().any(|other| other.key == entry.key && other.tenant != entry.tenant));
    }
    entries.sort_by(|a, b| (&a.tenant, &a.key).cmp(&(&b.tenant, &b.key)));
    entries.dedup();
    Ok(entries)
}

/// A Kubernetes label value: at most 63 characters, alphanumerics with `-`, `_`, `.` inside.
pub fn is_label_value(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[tokio::test]
    async fn keys_name_tenants_and_changes_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("team-a"), "aaaaaaaaaaaaaaaa-1\n\naaaaaaaaaaaaaaaa-2\nshort\n").unwrap();
        std::fs::write(dir.path().join("team-b"), "bbbbbbbbbbbbbbbb-1\nshared-key-000000\n").unwrap();
        std::fs::write(dir.path().join("team-c"), "shared-key-000000\n").unwrap();
        std::fs::write(dir.path().join("..data"), "hidden-key-0000000\n").unwrap();
        let keys = Keys::watch(dir.path().to_owned(), Duration::from_millis(20)).unwrap();

        assert_eq!(keys.tenant(&headers("Bearer aaaaaaaaaaaaaaaa-2")).unwrap(), "team-a");
        assert_eq!(keys.tenant(&headers("bearer bbbbbbbbbbbbbbbb-1")).unwrap(), "team-b");
        for refused in
            ["Bearer short", "Bearer shared-key-000000", "Bearer hidden-key-0000000", "Basic aaaaaaaaaaaaaaaa-1"]
        {
            assert_eq!(keys.tenant(&headers(refused)).unwrap_err().status(), StatusCode::UNAUTHORIZED, "{refused}");
        }
        assert_eq!(keys.tenant(&HeaderMap::new()).unwrap_err().status(), StatusCode::UNAUTHORIZED);

        std::fs::write(dir.path().join("team-a"), "aaaaaaaaaaaaaaaa-3\n").unwrap();
        let mut seen = false;
        for _ in 0..500 {
            if keys.tenant(&headers("Bearer aaaaaaaaaaaaaaaa-3")).is_ok() {
                seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(seen, "the new key works without a restart");
        assert!(keys.tenant(&headers("Bearer aaaaaaaaaaaaaaaa-1")).is_err(), "the removed key stops working");
    }

    #[test]
    fn without_keys_everyone_is_default() {
        assert_eq!(Keys::open_to_all().tenant(&HeaderMap::new()).unwrap(), DEFAULT_TENANT);
    }

    #[test]
    fn label_values() {
        assert!(is_label_value("team-a") && is_label_value("A.b_c"));
        assert!(
            !is_label_value("-a") && !is_label_value("a/b") && !is_label_value("") && !is_label_value(&"a".repeat(64))
        );
    }
}
