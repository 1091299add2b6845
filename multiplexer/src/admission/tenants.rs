//! Tenants, named by `x-teifleet-tenant` (or, later, by an API key), each with a weight. The
//! table is bounded: the first [`MAX_TENANTS`] names seen get a queue of their own, later ones
//! share the `other` tenant, so a client inventing names cannot grow memory or metrics.

use std::collections::{BTreeMap, HashMap};

/// The tenant of calls that name none.
pub const DEFAULT_TENANT: &str = "default";
/// Where tenants beyond the bound go, and the metric label of every tenant not configured.
pub const OTHER_TENANT: &str = "other";
/// Tenants tracked one by one.
pub const MAX_TENANTS: usize = 64;
/// Weight of tenants the spec does not list.
pub const DEFAULT_WEIGHT: u32 = 1;

/// A small number naming a tenant within one pool's admission state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(pub(super) u32);

#[derive(Debug)]
pub struct Tenants {
    ids: HashMap<String, TenantId>,
    names: Vec<String>,
    configured: BTreeMap<String, u32>,
}

impl Default for Tenants {
    fn default() -> Self {
        let mut tenants = Self { ids: HashMap::new(), names: Vec::new(), configured: BTreeMap::new() };
        tenants.insert(DEFAULT_TENANT);
        tenants.insert(OTHER_TENANT);
        tenants
    }
}

impl Tenants {
    fn insert(&mut self, name: &str) -> TenantId {
        let id = TenantId(self.names.len() as u32);
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        id
    }

    /// The id for a call's tenant name (`None`: the default tenant).
    pub fn id_of(&mut self, name: Option<&str>) -> TenantId {
        let name = name.unwrap_or(DEFAULT_TENANT);
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        if self.names.len() >= MAX_TENANTS && !self.configured.contains_key(name) {
            return self.ids[OTHER_TENANT];
        }
        self.insert(name)
    }

    pub fn weight(&self, id: TenantId) -> u32 {
        self.configured.get(&self.names[id.0 as usize]).copied().unwrap_or(DEFAULT_WEIGHT).max(1)
    }

    /// The metric label: configured tenants by name, the default tenant as itself, others as
    /// `other` (per-tenant series are opt-in through the spec).
    pub fn label(&self, id: TenantId) -> &str {
        let name = &self.names[id.0 as usize];
        if name == DEFAULT_TENANT || self.configured.contains_key(name) { name } else { OTHER_TENANT }
    }

    pub fn set_weights(&mut self, weights: BTreeMap<String, u32>) {
        self.configured = weights;
    }

    pub fn weights(&self) -> &BTreeMap<String, u32> {
        &self.configured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_and_weighted() {
        let mut tenants = Tenants::default();
        tenants.set_weights(BTreeMap::from([("search".to_owned(), 3)]));
        let search = tenants.id_of(Some("search"));
        assert_eq!((tenants.weight(search), tenants.label(search)), (3, "search"));
        let anonymous = tenants.id_of(None);
        assert_eq!((tenants.weight(anonymous), tenants.label(anonymous)), (1, "default"));
        let batch = tenants.id_of(Some("batch"));
        assert_eq!(tenants.label(batch), "other", "not configured: no series of its own");
        assert_ne!(batch, tenants.id_of(Some("other")), "but a queue of its own");
        for i in 0..200 {
            tenants.id_of(Some(&format!("t{i}")));
        }
        assert_eq!(tenants.names.len(), MAX_TENANTS);
        assert_eq!(tenants.id_of(Some("late")), tenants.id_of(Some(OTHER_TENANT)), "beyond the bound: shared");
    }
}
