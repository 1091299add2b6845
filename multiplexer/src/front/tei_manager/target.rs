//! A tei-manager wrapper message read without decoding it (`{target = 1, request = 2}`, the
//! request a tei.v1 message as it goes to TEI) and its `Target` as the routing headers a tei.v1
//! call would carry: `instance_name` names the pool (`x-teifleet-pool`), `model_id` the model a
//! pool serves (`x-teifleet-model`), `instance_index` is refused (pools have names, not places).

use bytes::{Buf as _, Bytes};
use http::{HeaderMap, HeaderValue};
use teifleet_wire::headers::{MODEL, POOL};

use super::error::ManagerError;

/// Where a call goes, from its `Target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Pool(String),
    Model(String),
}

impl Target {
    /// Sets the call's routing headers to this target's, replacing any the caller sent.
    pub fn route(&self, headers: &mut HeaderMap) -> Result<(), ManagerError> {
        let (set, clear, value) = match self {
            Self::Pool(name) => (POOL, MODEL, name),
            Self::Model(model) => (MODEL, POOL, model),
        };
        // Not a valid header value: no pool or model has such a name.
        let value = HeaderValue::from_str(value).map_err(|_| match self {
            Self::Pool(_) => ManagerError::EmptyInstance,
            Self::Model(_) => ManagerError::EmptyModel,
        })?;
        headers.remove(clear);
        headers.insert(set, value);
        Ok(())
    }
}

/// A wrapper message's two fields: its target's bytes (if sent) and its tei.v1 request's.
#[derive(Debug, Default)]
pub struct Wrapped {
    pub target: Option<Bytes>,
    pub request: Option<Bytes>,
}

/// Reads fields 1 and 2 of `message` (the last occurrence wins, as protobuf merges them); other
/// fields are skipped.
pub fn unwrap(message: &Bytes) -> Result<Wrapped, ManagerError> {
    let mut wrapped = Wrapped::default();
    for_each_field(message, |number, value| match number {
        1 => wrapped.target = value,
        2 => wrapped.request = value,
        _ => {}
    })?;
    Ok(wrapped)
}

/// The `Target` a wrapper carried.
pub fn target(bytes: Option<&Bytes>) -> Result<Target, ManagerError> {
    let bytes = bytes.ok_or(ManagerError::MissingTarget)?;
    let mut routing = None;
    for_each_field(bytes, |number, value| match (number, value) {
        (1, Some(name)) => routing = Some(Ok(name)),
        (2, Some(model)) => routing = Some(Err(Some(model))),
        (3, _) => routing = Some(Err(None)),
        _ => {}
    })?;
    let text =
        |bytes: Bytes| String::from_utf8(bytes.to_vec()).map_err(|_| ManagerError::Undecodable { what: "Target" });
    match routing {
        None => Err(ManagerError::NoRouting),
        Some(Ok(name)) if name.is_empty() => Err(ManagerError::EmptyInstance),
        Some(Ok(name)) => Ok(Target::Pool(text(name)?)),
        Some(Err(Some(model))) if model.is_empty() => Err(ManagerError::EmptyModel),
        Some(Err(Some(model))) => Ok(Target::Model(text(model)?)),
        Some(Err(None)) => Err(ManagerError::InstanceIndex),
    }
}

/// Calls `each` with every top-level field's number and, for a length-delimited one, its bytes
/// (sliced from `message`, not copied).
fn for_each_field(message: &Bytes, mut each: impl FnMut(u32, Option<Bytes>)) -> Result<(), ManagerError> {
    let malformed = || ManagerError::Undecodable { what: "tei_multiplexer.v1 message" };
    let mut rest = &message[..];
    while !rest.is_empty() {
        let key = prost::encoding::decode_varint(&mut rest).map_err(|_| malformed())?;
        let number = u32::try_from(key >> 3).map_err(|_| malformed())?;
        match key & 7 {
            0 => {
                prost::encoding::decode_varint(&mut rest).map_err(|_| malformed())?;
                each(number, None);
            }
            1 | 5 => {
                let width = if key & 7 == 1 { 8 } else { 4 };
                if rest.len() < width {
                    return Err(malformed());
                }
                rest.advance(width);
                each(number, None);
            }
            2 => {
                let len = usize::try_from(prost::encoding::decode_varint(&mut rest).map_err(|_| malformed())?)
                    .map_err(|_| malformed())?;
                if len > rest.len() {
                    return Err(malformed());
                }
                let start = message.len() - rest.len();
                each(number, Some(message.slice(start..start + len)));
                rest.advance(len);
            }
            _ => return Err(malformed()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use teifleet_proto::tei_multiplexer::v1 as mux;
    use teifleet_proto::v1;

    use super::*;

    fn wrapper(routing: Option<mux::target::Routing>) -> Bytes {
        let request = v1::EmbedRequest { inputs: "hi".into(), ..Default::default() };
        let target = routing.map(|routing| mux::Target { routing: Some(routing) });
        Bytes::from(mux::EmbedRequest { target, request: Some(request) }.encode_to_vec())
    }

    #[test]
    fn the_request_is_field_two_as_sent() {
        let message = wrapper(Some(mux::target::Routing::InstanceName("pool-a".into())));
        let wrapped = unwrap(&message).unwrap();
        let inner = v1::EmbedRequest::decode(wrapped.request.unwrap()).unwrap();
        assert_eq!(inner.inputs, "hi");
        assert_eq!(target(wrapped.target.as_ref()).unwrap(), Target::Pool("pool-a".into()));
    }

    #[test]
    fn targets_map_to_pools_and_models() {
        let model = wrapper(Some(mux::target::Routing::ModelId("m".into())));
        assert_eq!(target(unwrap(&model).unwrap().target.as_ref()).unwrap(), Target::Model("m".into()));
        let index = wrapper(Some(mux::target::Routing::InstanceIndex(0)));
        assert!(matches!(target(unwrap(&index).unwrap().target.as_ref()), Err(ManagerError::InstanceIndex)));
        let empty = wrapper(Some(mux::target::Routing::InstanceName(String::new())));
        assert!(matches!(target(unwrap(&empty).unwrap().target.as_ref()), Err(ManagerError::EmptyInstance)));
        assert!(matches!(target(unwrap(&wrapper(None)).unwrap().target.as_ref()), Err(ManagerError::MissingTarget)));
        assert!(unwrap(&Bytes::from_static(&[0x12, 0x05, 1])).is_err(), "a field longer than the message");
    }
}
