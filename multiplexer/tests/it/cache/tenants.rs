//! Tenants, named by their API keys: one tenant's cached answers are never another's unless the
//! pool shares them (`sharedAcrossTenants: true`).

use teifleet_proto::v1;

use super::fleet::*;
use crate::support::sim;

const KEY_A: &str = "tenant-a-key-0123456789abcdef";
const KEY_B: &str = "tenant-b-key-0123456789abcdef";
const KEYS: &[(&str, &str)] = &[("ta", KEY_A), ("tb", KEY_B)];

fn pool(sim: &teifleet_tei_sim::SimHandle, shared: bool) -> PoolConfig {
    let mut pool = PoolConfig::cached(POOL_NAME, sim, "64Mi");
    pool.tenants = vec!["ta".into(), "tb".into()];
    pool.cache.as_mut().unwrap().shared_across_tenants = shared;
    pool
}

fn request(text: &str) -> v1::EmbedRequest {
    v1::EmbedRequest { inputs: text.into(), normalize: Some(true), ..Default::default() }
}

/// What tenant `tenant`'s inputs counted as `result`.
async fn counted(replica: &Replica, tenant: &str, result: &str) -> f64 {
    let labels = [("pool", POOL_NAME), ("tenant", tenant), ("result", result)];
    replica.metric("teifleet_cache_inputs_total", &labels).await
}

#[tokio::test]
async fn a_tenant_never_gets_another_tenants_entry() {
    let sim = sim(|_| {}).await;
    let replica = Replica::start(&[pool(&sim, false)], KEYS).await;
    let text = "a tenant's private text";

    let before = work(&sim);
    let (first_a, cache) = replica.embed_as(POOL_NAME, Some(KEY_A), request(text)).await.unwrap();
    assert_eq!(cache.as_deref(), Some("miss"));
    let (_, cache) = replica.embed_as(POOL_NAME, Some(KEY_A), request(text)).await.unwrap();
    assert_eq!(cache.as_deref(), Some("hit"), "tenant a hits its own entry");
    assert_eq!(work(&sim) - before, 1);

    let (first_b, cache) = replica.embed_as(POOL_NAME, Some(KEY_B), request(text)).await.unwrap();
    assert_eq!(cache.as_deref(), Some("miss"), "tenant b does not get tenant a's entry");
    assert_eq!(work(&sim) - before, 2, "TEI did the work again for b");
    assert_eq!(first_b.embeddings, first_a.embeddings, "the same text, the same vector: TEI's, twice");
    let (_, cache) = replica.embed_as(POOL_NAME, Some(KEY_B), request(text)).await.unwrap();
    assert_eq!(cache.as_deref(), Some("hit"), "tenant b hits its own entry");
    assert_eq!(work(&sim) - before, 2);

    assert!(counted(&replica, "ta", "hit_local").await >= 1.0, "{}", replica.metrics().await);
    assert_eq!(counted(&replica, "tb", "miss").await, 1.0, "tenant b's miss, under its name");
    assert_eq!(counted(&replica, "tb", "hit_local").await, 1.0);
}

#[tokio::test]
async fn tenants_share_entries_when_the_pool_says_so() {
    let sim = sim(|_| {}).await;
    let replica = Replica::start(&[pool(&sim, true)], KEYS).await;
    let text = "a text every tenant may share";

    let before = work(&sim);
    let (first_a, cache) = replica.embed_as(POOL_NAME, Some(KEY_A), request(text)).await.unwrap();
    assert_eq!(cache.as_deref(), Some("miss"));
    let (for_b, cache) = replica.embed_as(POOL_NAME, Some(KEY_B), request(text)).await.unwrap();
    assert_eq!(cache.as_deref(), Some("hit"), "shared across tenants: b hits a's entry");
    assert_eq!(for_b, first_a);
    assert_eq!(work(&sim) - before, 1, "TEI did it once");
    assert_eq!(counted(&replica, "tb", "hit_local").await, 1.0);
}
