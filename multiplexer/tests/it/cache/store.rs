//! The shared tier: replicas of a pool sharing one redis-server (Debian's, through
//! `teifleet_testkit::redis`), each replica in front of a TEI of its own. An answer one replica
//! stored is a hit at another; the store going down under load fails no call, is counted, and
//! its coming back resumes the hits; a store that refuses the password is as good as down; and
//! the store shares nothing across pools or tenants.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use prost::Message as _;
use teifleet_proto::v1;
use teifleet_tei_sim::{SimHandle, embedding_for};
use teifleet_testkit::redis::{Redis, RedisOptions};

use super::fleet::*;
use crate::support::sim;

fn request(text: &str) -> v1::EmbedRequest {
    v1::EmbedRequest { inputs: text.into(), normalize: Some(true), ..Default::default() }
}

/// A redis-server of this test's own, or `None` (the test skipped) where there is none.
async fn redis(test: &str, options: RedisOptions) -> Option<Redis> {
    let bin = Redis::bin_or_skip(test)?;
    let dir = std::env::temp_dir().join(format!("teifleet-cache-redis-{test}-{}", std::process::id()));
    Some(Redis::start(&bin, &dir, options).await.expect("redis-server starts"))
}

fn dir_of(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!("teifleet-cache-redis-{test}-{}", std::process::id()))
}

/// Two replicas of pool `a` sharing `store`, each with its own TEI.
async fn two_replicas(store: &Store) -> [(SimHandle, Replica); 2] {
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let sim = sim(|_| {}).await;
        let replica =
            Replica::start(&[PoolConfig::cached(POOL_NAME, &sim, "64Mi").with_store(store.clone())], &[]).await;
        replicas.push((sim, replica));
    }
    let second = replicas.pop().unwrap();
    [replicas.pop().unwrap(), second]
}

async fn stored_in_store(replica: &Replica) -> f64 {
    replica.metric("teifleet_cache_stored_total", &[("pool", POOL_NAME), ("tier", "store")]).await
}

async fn store_errors(replica: &Replica) -> f64 {
    replica.metric("teifleet_cache_store_errors_total", &[("pool", POOL_NAME)]).await
}

/// Embeds `text` at `from` and waits until `from` has written it to the store.
async fn store_through(from: &Replica, text: &str) -> v1::EmbedResponse {
    let before = stored_in_store(from).await;
    let (answer, _) = from.embed(request(text)).await.expect("served");
    teifleet_testkit::poll::eventually("the answer written to the store", Duration::from_secs(10), || async {
        (stored_in_store(from).await > before).then_some(())
    })
    .await;
    answer
}

/// An answer replica 1 stored is a hit at replica 2, from the store: byte for byte replica 1's
/// TEI's answer, and replica 2's TEI did nothing.
#[tokio::test]
async fn an_answer_stored_by_one_replica_is_a_hit_at_another() {
    let Some(redis) = redis("shared", RedisOptions::default()).await else { return };
    let [(sim1, one), (sim2, two)] = two_replicas(&Store::at(redis.url())).await;
    let text = "shared between replicas";

    let (work1, work2) = (work(&sim1), work(&sim2));
    let answer = store_through(&one, text).await;
    assert!(redis.keys().await.unwrap() >= 1, "written to redis");
    let hits_before = two.inputs("hit_store").await;
    let (at_two, cache) = two.embed(request(text)).await.unwrap();
    assert_eq!(cache.as_deref(), Some("hit"));
    assert_eq!(at_two.encode_to_vec(), answer.encode_to_vec(), "replica 1's TEI's answer, byte for byte");
    assert_eq!(two.inputs("hit_store").await - hits_before, 1.0, "a hit from the store");
    assert_eq!((work(&sim1) - work1, work(&sim2) - work2), (1, 0), "TEI did it once, at replica 1");
    assert_eq!(two.metric("teifleet_cache_store_up", &[("pool", POOL_NAME)]).await, 1.0);
    std::fs::remove_dir_all(dir_of("shared")).ok();
}

/// 8 callers, 320 calls, and the store killed a third of the way in: every call is served, the
/// store's errors are counted; once it is back, an answer stored at one replica is a hit from
/// the store at the other again.
#[tokio::test]
async fn the_store_killed_under_load_fails_no_call_and_hits_resume_after() {
    const CALLERS: usize = 8;
    const CALLS: usize = 40;
    let Some(mut redis) = redis("killed", RedisOptions::default()).await else { return };
    let [(_sim1, mut one), (_sim2, mut two)] = two_replicas(&Store::at(redis.url())).await;
    let errors_before = store_errors(&one).await;

    let done = Arc::new(AtomicUsize::new(0));
    let channel = one.channel();
    let mut callers = Vec::new();
    for caller in 0..CALLERS {
        let (done, channel) = (done.clone(), channel.clone());
        callers.push(tokio::spawn(async move {
            let mut client = v1::embed_client::EmbedClient::new(channel);
            let mut failed = Vec::new();
            for call in 0..CALLS {
                // Half the texts repeat (hits, once the store or the tier has them), half are new.
                let text =
                    if call % 2 == 0 { format!("repeated {}", call % 10) } else { format!("new {caller} {call}") };
                match client.embed(request(&text)).await {
                    Ok(answer) if answer.get_ref().embeddings == embedding_for(&text, 384) => {}
                    Ok(_) => failed.push(format!("{text}: a wrong vector")),
                    Err(status) => failed.push(format!("{text}: {status}")),
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            failed
        }));
    }
    crate::support::until("a third of the calls done", Duration::from_secs(60), || {
        done.load(Ordering::Relaxed) >= CALLERS * CALLS / 3
    })
    .await;
    redis.stop();
    let mut failed = Vec::new();
    for caller in callers {
        failed.extend(caller.await.unwrap());
    }
    assert!(failed.is_empty(), "calls failed with the store down: {failed:?}");
    assert!(one.alive() && two.alive());
    // Calls after the kill that reach the store (not skipped for a backoff) fail there.
    for i in 0..5 {
        one.embed(request(&format!("while down {i}"))).await.expect("served without the store");
    }
    let errors = store_errors(&one).await - errors_before;
    eprintln!("store killed under load: {errors} store errors counted, no call failed");
    assert!(errors > 0.0, "the store's failures counted: {}", one.metrics().await);

    redis.restart().await.expect("redis-server comes back on its port");
    // The replicas skip the store for a backoff after failures: new texts until one stored at
    // replica 1 is a hit from the store at replica 2.
    let hits_before = two.inputs("hit_store").await;
    let mut n = 0;
    teifleet_testkit::poll::eventually("hits from the store again", Duration::from_secs(60), || {
        n += 1;
        let text = format!("after the restart {n}");
        let (one, two) = (&one, &two);
        async move {
            one.embed(request(&text)).await.expect("served");
            tokio::time::sleep(Duration::from_millis(100)).await;
            let (answer, cache) = two.embed(request(&text)).await.expect("served");
            assert_eq!(answer.embeddings, embedding_for(&text, 384));
            (cache.as_deref() == Some("hit")).then_some(())
        }
    })
    .await;
    assert_eq!(two.inputs("hit_store").await - hits_before, 1.0);
    assert!(redis.keys().await.unwrap() >= 1);
    std::fs::remove_dir_all(dir_of("killed")).ok();
}

/// A store that requires a password: the right one (from `passwordFile`) shares answers; a wrong
/// one, or none, is a store that fails: counted, and every call still served.
#[tokio::test]
async fn a_store_password_is_used_and_a_wrong_one_only_costs_the_store() {
    const PASSWORD: &str = "the-store-password-0123456789";
    let options = RedisOptions { password: Some(PASSWORD.into()) };
    let Some(redis) = redis("password", options).await else { return };
    let with = |password: Option<&str>| Store { password: password.map(str::to_owned), ..Store::at(redis.url()) };

    let [(_s1, one), (sim2, two)] = two_replicas(&with(Some(PASSWORD))).await;
    store_through(&one, "behind a password").await;
    let before = work(&sim2);
    let (_, cache) = two.embed(request("behind a password")).await.unwrap();
    assert_eq!(cache.as_deref(), Some("hit"), "the right password reaches the store");
    assert_eq!(work(&sim2), before);
    let keys = redis.keys().await.unwrap();

    for (name, password) in [("wrong", Some("not-the-password-0123456789")), ("missing", None)] {
        let sim = sim(|_| {}).await;
        let pool = PoolConfig::cached(POOL_NAME, &sim, "64Mi").with_store(with(password));
        let replica = Replica::start(&[pool], &[]).await;
        for i in 0..10 {
            let text = format!("{name} password {i}");
            let (answer, _) = replica.embed(request(&text)).await.expect("served without the store");
            assert_eq!(answer.embeddings, embedding_for(&text, 384));
        }
        // Asked at a replica whose store works, none of these was stored.
        let (_, cache) = two.embed(request(&format!("{name} password 3"))).await.unwrap();
        assert_eq!(cache.as_deref(), Some("miss"), "{name} password: nothing reached the store");
        let errors = store_errors(&replica).await;
        eprintln!("{name} password: {errors} store errors");
        assert!(errors > 0.0, "{name} password: counted as store errors: {}", replica.metrics().await);
        // 0 from its last failure on (a write in the background may be failing still).
        teifleet_testkit::poll::eventually("the store seen down", Duration::from_secs(10), || async {
            (replica.metric("teifleet_cache_store_up", &[("pool", POOL_NAME)]).await == 0.0).then_some(())
        })
        .await;
    }
    assert!(redis.keys().await.unwrap() >= keys, "the store was not harmed");
    std::fs::remove_dir_all(dir_of("password")).ok();
}

/// One store, two pools of one sidecar, each in front of its own TEI (other models, other
/// dimensions): the same text at pool b is b's TEI's answer, never pool a's stored one; and two
/// tenants at two replicas: b never gets a's entry from the store.
#[tokio::test]
async fn the_store_shares_nothing_across_pools_or_tenants() {
    let Some(redis) = redis("scopes", RedisOptions::default()).await else { return };
    let store = Store::at(redis.url());
    let sim_a = sim(|_| {}).await;
    let sim_b = sim(|config| {
        config.dimensions = 8;
        config.model_id = "teifleet/other-model".into();
    })
    .await;
    let pools = [
        PoolConfig::cached(POOL_NAME, &sim_a, "64Mi").with_store(store.clone()),
        PoolConfig::cached("b", &sim_b, "64Mi").with_store(store.clone()),
    ];
    let replica = Replica::start(&pools, &[]).await;
    let text = "one text, two pools";
    store_through(&replica, text).await;
    let before = work(&sim_b);
    let (at_b, cache) = replica.embed_as("b", None, request(text)).await.unwrap();
    assert_eq!(cache.as_deref(), Some("miss"), "pool b never hits pool a's entry");
    assert_eq!(at_b.embeddings, embedding_for(text, 8), "pool b's TEI's answer");
    assert_eq!(work(&sim_b) - before, 1);
    drop(replica);

    const KEYS: &[(&str, &str)] = &[("ta", "tenant-a-key-0123456789abcdef"), ("tb", "tenant-b-key-0123456789abcdef")];
    let mut tenants = Vec::new();
    for _ in 0..2 {
        let sim = sim(|_| {}).await;
        let mut pool = PoolConfig::cached(POOL_NAME, &sim, "64Mi").with_store(store.clone());
        pool.tenants = vec!["ta".into(), "tb".into()];
        tenants.push((Replica::start(&[pool], KEYS).await, sim));
    }
    let text = "tenant a's text, in the store";
    let before = stored_in_store(&tenants[0].0).await;
    tenants[0].0.embed_as(POOL_NAME, Some(KEYS[0].1), request(text)).await.unwrap();
    teifleet_testkit::poll::eventually("a's answer in the store", Duration::from_secs(10), || async {
        (stored_in_store(&tenants[0].0).await > before).then_some(())
    })
    .await;
    let (second, sim2) = (&tenants[1].0, &tenants[1].1);
    let before = work(sim2);
    let (_, cache) = second.embed_as(POOL_NAME, Some(KEYS[1].1), request(text)).await.unwrap();
    assert_eq!(cache.as_deref(), Some("miss"), "tenant b never gets a's entry from the store");
    assert_eq!(work(sim2) - before, 1);
    let (_, cache) = second.embed_as(POOL_NAME, Some(KEYS[0].1), request(text)).await.unwrap();
    assert_eq!(cache.as_deref(), Some("hit"), "tenant a does, at the other replica");
    std::fs::remove_dir_all(dir_of("scopes")).ok();
}

async fn forged(replica: &Replica) -> f64 {
    replica
        .metric("teifleet_cache_store_errors_total", &[("pool", POOL_NAME), ("op", "get"), ("reason", "forged")])
        .await
}

async fn entry_names(client: &mut ::redis::aio::MultiplexedConnection) -> Vec<String> {
    ::redis::cmd("KEYS").arg("teifleet:embed:v1:*").query_async(client).await.unwrap()
}

/// The store's name of `text`'s entry: the one that appears when `from` embeds it.
async fn stored_as(client: &mut ::redis::aio::MultiplexedConnection, from: &Replica, text: &str) -> String {
    let before = entry_names(client).await;
    store_through(from, text).await;
    let mut new: Vec<String> = entry_names(client).await.into_iter().filter(|n| !before.contains(n)).collect();
    assert_eq!(new.len(), 1, "one new entry for {text:?}");
    new.remove(0)
}

/// The store is not trusted with answers: an entry changed by someone without the pool's peer key
/// (one bit of its vector), or a sealed entry copied under another text's key, is a miss counted
/// as forged, and TEI's own answer is what the caller gets.
#[tokio::test]
async fn a_forged_or_moved_store_entry_is_a_miss() {
    let Some(redis) = redis("forged", RedisOptions::default()).await else { return };
    let peer_key = "a-peer-key-of-this-pool-32-characters-or-more";
    let store = Store { peer_key: Some(peer_key.into()), ..Store::at(redis.url()) };
    let [(_sim1, one), (sim2, two)] = two_replicas(&store).await;
    let mut client = ::redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();

    // A bit of the vector flipped in place.
    let flipped = stored_as(&mut client, &one, "flipped").await;
    let mut value: Vec<u8> = ::redis::cmd("GET").arg(&flipped).query_async(&mut client).await.unwrap();
    *value.last_mut().unwrap() ^= 0x01;
    let () = ::redis::cmd("SET").arg(&flipped).arg(value).query_async(&mut client).await.unwrap();
    let forged_before = forged(&two).await;
    let work_before = work(&sim2);
    let (answer, cache) = two.embed(request("flipped")).await.unwrap();
    assert_eq!(cache.as_deref(), Some("miss"), "a changed entry is not an answer");
    assert_eq!(answer.embeddings, embedding_for("flipped", 384), "TEI's vector");
    assert_eq!(work(&sim2) - work_before, 1, "TEI was asked");
    assert!(forged(&two).await > forged_before, "the changed entry counted as forged");

    // A sealed entry copied under another text's key.
    let planted = stored_as(&mut client, &one, "planted").await;
    let sealed: Vec<u8> = ::redis::cmd("GET").arg(&planted).query_async(&mut client).await.unwrap();
    let victim = stored_as(&mut client, &one, "the victim's text").await;
    let () = ::redis::cmd("SET").arg(&victim).arg(sealed).query_async(&mut client).await.unwrap();
    // Replica 2 never asked for it: its local tier is cold, and it reads the store.
    let forged_before = forged(&two).await;
    let (answer, cache) = two.embed(request("the victim's text")).await.unwrap();
    assert_eq!(cache.as_deref(), Some("miss"), "an entry moved under another text is not its answer");
    assert_eq!(answer.embeddings, embedding_for("the victim's text", 384), "TEI's vector, not the planted one");
    assert!(forged(&two).await > forged_before, "the moved entry counted as forged");
    std::fs::remove_dir_all(dir_of("forged")).ok();
}
