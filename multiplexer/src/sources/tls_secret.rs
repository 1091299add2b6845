//! Kubernetes mode, with `spec.tls`: the certificate set from the `kubernetes.io/tls` Secret the
//! pool names (`tls.crt`, `tls.key`, and `ca.crt` to trust peers with), and for mutual TLS the
//! client CA bundle from the Secret or ConfigMap `spec.tls.clientCA` names. Each is watched by
//! its one name (the sidecar's Role grants those names and no other), so cert-manager's renewal
//! is in force for new connections within a second.
//!
//! Nothing here takes the pool down: a Secret that goes missing or holds a broken set leaves the
//! set in force (and says why, in the report the operator turns into the `TLSReady` condition).
//! A client CA that cannot be read is never dropped silently: no set is offered without it.

use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use teifleet_crds::{ClientCaSpec, TlsSpec};
use teifleet_runtime::tls::Material;
use tokio_util::sync::CancellationToken;

use crate::transport::tls::Offered;

/// What a watch of one named object has shown so far.
#[derive(Clone, Debug, PartialEq)]
enum Seen<T> {
    Unknown,
    Missing,
    Present(T),
}

/// One watched object's events, as what it now holds (`Seen`), or `None` for events that change
/// nothing.
fn follow<K>(api: Api<K>, name: String) -> impl Stream<Item = Seen<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut listed = false;
    watcher(api, config).default_backoff().filter_map(move |event| {
        let seen = match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                listed = true;
                Some(Seen::Present(object))
            }
            Ok(watcher::Event::Delete(_)) => Some(Seen::Missing),
            Ok(watcher::Event::Init) => {
                listed = false;
                None
            }
            Ok(watcher::Event::InitDone) => (!listed).then_some(Seen::Missing),
            Err(error) => {
                tracing::warn!(object = %name, %error, "TLS object watch failed; retrying");
                None
            }
        };
        std::future::ready(seen)
    })
}

fn secret_value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret.data.as_ref()?.get(key).map(|value| value.0.clone())
}

fn config_map_value(map: &ConfigMap, key: &str) -> Option<Vec<u8>> {
    let text = map.data.as_ref().and_then(|data| data.get(key)).map(|text| text.as_bytes().to_vec());
    text.or_else(|| map.binary_data.as_ref()?.get(key).map(|value| value.0.clone()))
}

/// The set `spec` names, from what the watches have shown: `Ok(None)` while something is not
/// read yet, `Err` with why it cannot be had.
fn material(
    spec: &TlsSpec,
    secret: &Seen<Secret>,
    client_ca: &Option<Seen<Option<Vec<u8>>>>,
) -> Result<Option<Material>, String> {
    let name = &spec.secret_name;
    let secret = match secret {
        Seen::Unknown => return Ok(None),
        Seen::Missing => return Err(format!("the TLS Secret {name:?} does not exist")),
        Seen::Present(secret) => secret,
    };
    let value = |key: &str| secret_value(secret, key);
    let chain = value("tls.crt").ok_or_else(|| format!("the TLS Secret {name:?} has no tls.crt"))?;
    let key = value("tls.key").ok_or_else(|| format!("the TLS Secret {name:?} has no tls.key"))?;
    let client_ca = match client_ca {
        None => None,
        Some(Seen::Unknown) => return Ok(None),
        Some(Seen::Missing) => return Err(format!("the client CA {} does not exist", describe(spec))),
        Some(Seen::Present(None)) => return Err(format!("the client CA {} has no such key", describe(spec))),
        Some(Seen::Present(Some(bundle))) => Some(bundle.clone()),
    };
    Ok(Some(Material { chain, key, ca: value(teifleet_crds::CA_BUNDLE_KEY), client_ca }))
}

fn describe(spec: &TlsSpec) -> String {
    match &spec.client_ca {
        Some(ClientCaSpec { secret_name: Some(name), key, .. }) => format!("Secret {name:?} key {key:?}"),
        Some(ClientCaSpec { config_map_name: Some(name), key, .. }) => format!("ConfigMap {name:?} key {key:?}"),
        _ => "(none)".into(),
    }
}

/// The client CA bundle's watch, as the bundle it holds.
fn follow_client_ca(client: &Client, namespace: &str, ca: &ClientCaSpec) -> impl Stream<Item = Seen<Option<Vec<u8>>>> {
    let key = ca.key.clone();
    let (secrets, maps) = match (&ca.secret_name, &ca.config_map_name) {
        (Some(name), _) => (Some(follow(Api::<Secret>::namespaced(client.clone(), namespace), name.clone())), None),
        (None, Some(name)) => {
            (None, Some(follow(Api::<ConfigMap>::namespaced(client.clone(), namespace), name.clone())))
        }
        (None, None) => (None, None),
    };
    let key_of_secret = key.clone();
    let secrets = futures::stream::iter(secrets).flatten().map(move |seen| match seen {
        Seen::Present(secret) => Seen::Present(secret_value(&secret, &key_of_secret)),
        Seen::Missing => Seen::Missing,
        Seen::Unknown => Seen::Unknown,
    });
    let maps = futures::stream::iter(maps).flatten().map(move |seen| match seen {
        Seen::Present(map) => Seen::Present(config_map_value(&map, &key)),
        Seen::Missing => Seen::Missing,
        Seen::Unknown => Seen::Unknown,
    });
    futures::stream::select(secrets, maps)
}

enum Change {
    Secret(Box<Seen<Secret>>),
    ClientCa(Seen<Option<Vec<u8>>>),
}

/// Offers `spec`'s set to `certificates` (the sidecar's, or one pool's at the activator)
/// whenever what it names changes, until `stop`.
pub async fn watch<O: Offered + ?Sized>(
    client: Client,
    namespace: String,
    spec: TlsSpec,
    certificates: Arc<O>,
    stop: CancellationToken,
) {
    let secret = follow(Api::<Secret>::namespaced(client.clone(), &namespace), spec.secret_name.clone());
    let changes = match &spec.client_ca {
        Some(ca) => futures::stream::select(
            secret.map(|seen| Change::Secret(Box::new(seen))).boxed(),
            follow_client_ca(&client, &namespace, ca).map(Change::ClientCa).boxed(),
        )
        .boxed(),
        None => secret.map(|seen| Change::Secret(Box::new(seen))).boxed(),
    };
    let mut changes = std::pin::pin!(changes.take_until(stop.cancelled_owned()));
    let (mut secret, mut client_ca) = (Seen::Unknown, spec.client_ca.as_ref().map(|_| Seen::Unknown));
    let mut offered: Option<Result<Material, String>> = None;
    while let Some(change) = changes.next().await {
        match change {
            Change::Secret(seen) => secret = *seen,
            Change::ClientCa(seen) => client_ca = Some(seen),
        }
        let now = match material(&spec, &secret, &client_ca) {
            Ok(None) => continue,
            Ok(Some(material)) => Ok(material),
            Err(why) => Err(why),
        };
        if offered.as_ref() == Some(&now) {
            continue;
        }
        match &now {
            Ok(material) => certificates.offer(material, &format!("Secret {}", spec.secret_name)),
            Err(why) => certificates.missing(why.clone()),
        }
        offered = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    fn tls_secret(entries: &[(&str, &str)]) -> Seen<Secret> {
        let data = entries.iter().map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec()))).collect();
        Seen::Present(Secret { data: Some(data), ..Secret::default() })
    }

    fn spec(client_ca: Option<ClientCaSpec>) -> TlsSpec {
        TlsSpec { secret_name: "bge-tls".into(), client_ca, allow_plaintext_routes: false }
    }

    #[test]
    fn the_set_is_offered_once_everything_it_names_is_read() {
        let plain = spec(None);
        assert_eq!(material(&plain, &Seen::Unknown, &None), Ok(None), "not read yet");
        let full = tls_secret(&[("tls.crt", "C"), ("tls.key", "K"), ("ca.crt", "A")]);
        let set = material(&plain, &full, &None).unwrap().unwrap();
        assert_eq!(
            (set.chain, set.key, set.ca, set.client_ca),
            (b"C".to_vec(), b"K".to_vec(), Some(b"A".to_vec()), None)
        );
        assert!(material(&plain, &Seen::Missing, &None).unwrap_err().contains("does not exist"));
        assert!(material(&plain, &tls_secret(&[("tls.crt", "C")]), &None).unwrap_err().contains("tls.key"));
    }

    #[test]
    fn mutual_tls_offers_nothing_without_its_client_ca() {
        let ca = ClientCaSpec { secret_name: None, config_map_name: Some("clients".into()), key: "ca.crt".into() };
        let mutual = spec(Some(ca));
        let full = tls_secret(&[("tls.crt", "C"), ("tls.key", "K")]);
        assert_eq!(material(&mutual, &full, &Some(Seen::Unknown)), Ok(None), "the bundle is not read yet");
        assert!(material(&mutual, &full, &Some(Seen::Missing)).unwrap_err().contains("ConfigMap \"clients\""));
        assert!(material(&mutual, &full, &Some(Seen::Present(None))).unwrap_err().contains("no such key"));
        let set = material(&mutual, &full, &Some(Seen::Present(Some(b"B".to_vec())))).unwrap().unwrap();
        assert_eq!(set.client_ca, Some(b"B".to_vec()));
    }

    #[test]
    fn a_config_maps_bundle_is_text_or_binary() {
        let text = ConfigMap { data: Some([("ca.crt".to_owned(), "PEM".to_owned())].into()), ..ConfigMap::default() };
        assert_eq!(config_map_value(&text, "ca.crt"), Some(b"PEM".to_vec()));
        let binary = ConfigMap {
            binary_data: Some([("ca.crt".to_owned(), ByteString(b"PEM".to_vec()))].into()),
            ..ConfigMap::default()
        };
        assert_eq!(config_map_value(&binary, "ca.crt"), Some(b"PEM".to_vec()));
        assert_eq!(config_map_value(&binary, "other"), None);
    }
}
