use std::net::{Ipv4Addr, SocketAddr};

use teifleet_tei_sim::{Fault, SimConfig};

use crate::common::{bounded, embed_client, embed_request, http, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_port_reports_and_controls() {
    bounded(async {
        let config =
            SimConfig { admin_listen: Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))), ..SimConfig::default() };
        let sim = start(config).await;
        let admin = sim.admin_addr().expect("admin port bound");
        let mut client = embed_client(&sim).await;
        client.embed(embed_request("counted")).await.unwrap();

        let (status, body) = http(admin, "GET", "/stats").await;
        assert_eq!(status, 200);
        let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(stats["requests_received"], 1);
        assert_eq!(stats["completed"], 1);
        assert_eq!(stats["in_flight"], 0);
        for key in ["requests_admitted", "requests_refused_overloaded", "max_in_flight_observed", "batches_run"] {
            assert!(stats.get(key).is_some(), "{key} missing from {body}");
        }

        let (status, body) = http(admin, "GET", "/metrics").await;
        assert_eq!(status, 200);
        for name in [
            "te_request_count 1",
            "te_request_success 1",
            "te_request_failure{err=\"overloaded\"} 0",
            "te_queue_size",
            "te_batch_next_size",
            "te_batch_next_tokens",
            "te_request_queue_duration_bucket",
            "te_request_inference_duration_count 1",
            "te_request_duration_sum",
        ] {
            assert!(body.contains(name), "{name} missing from metrics:\n{body}");
        }

        assert_eq!(http(admin, "GET", "/healthz").await.0, 200);
        let (status, body) = http(admin, "POST", "/fault/fail").await;
        assert_eq!((status, body.as_str()), (200, r#"{"fault":"fail"}"#));
        assert_eq!(sim.fault(), Fault::Fail);
        assert_eq!(http(admin, "GET", "/healthz").await.0, 503);
        assert_eq!(client.embed(embed_request("x")).await.unwrap_err().code(), tonic::Code::Unavailable);
        assert_eq!(http(admin, "POST", "/fault/stall").await.0, 200);
        assert_eq!(sim.fault(), Fault::Stall);
        assert_eq!(http(admin, "POST", "/fault/clear").await.0, 200);
        assert_eq!(sim.fault(), Fault::None);
        assert_eq!(http(admin, "GET", "/fault").await.1, r#"{"fault":"none"}"#);

        let (status, body) = http(admin, "POST", "/stats/reset").await;
        assert_eq!(status, 200);
        let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(stats["requests_received"], 0);
        assert_eq!(sim.stats().completed, 0);
        assert_eq!(http(admin, "GET", "/nope").await.0, 404);
        sim.shutdown().await;
    })
    .await;
}
