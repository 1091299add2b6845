//! Whether the gRPC port serves server reflection (`grpc.reflection.v1` and `v1alpha`), switched
//! live: a pool with API keys keeps it from callers without a key unless it asks for it
//! (`spec.grpc.reflection`), since reflection answers before any key is checked and describes the
//! whole API. Off, a reflection call is UNIMPLEMENTED, as TEI answers it without reflection.

use std::sync::atomic::{AtomicBool, Ordering};

/// The switch; both reflection services stay registered and answer only while it is on.
#[derive(Debug)]
pub struct Reflection(AtomicBool);

impl Reflection {
    pub fn new(served: bool) -> Self {
        Self(AtomicBool::new(served))
    }

    /// Serves reflection from the next call on (`true`), or answers it UNIMPLEMENTED.
    pub fn serve(&self, served: bool) {
        if self.0.swap(served, Ordering::Relaxed) != served {
            tracing::info!(served, "gRPC server reflection");
        }
    }

    pub fn served(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Whether a call of `path` is turned away: a reflection call while the switch is off.
    pub fn refuses(&self, path: &str) -> bool {
        is_reflection(path) && !self.served()
    }
}

impl Default for Reflection {
    /// On, as TEI serves it.
    fn default() -> Self {
        Self::new(true)
    }
}

/// A call of either reflection service (`/grpc.reflection.v1.ServerReflection/...`,
/// `/grpc.reflection.v1alpha.ServerReflection/...`).
pub fn is_reflection(path: &str) -> bool {
    path.strip_prefix("/grpc.reflection.").is_some_and(|rest| rest.contains(".ServerReflection/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reflection_calls_are_turned_away_and_only_while_off() {
        let v1 = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
        let v1alpha = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
        let reflection = Reflection::default();
        assert!(!reflection.refuses(v1) && !reflection.refuses(v1alpha), "on by default");
        reflection.serve(false);
        assert!(reflection.refuses(v1) && reflection.refuses(v1alpha));
        for other in ["/grpc.health.v1.Health/Check", "/tei.v1.Embed/Embed", "/grpc.reflection.v1", "/"] {
            assert!(!reflection.refuses(other), "{other}");
        }
        reflection.serve(true);
        assert!(!reflection.refuses(v1));
    }
}
