use futures::StreamExt;
use teifleet_proto::v1::info_client::InfoClient;
use teifleet_proto::v1::predict_client::PredictClient;
use teifleet_proto::v1::rerank_client::RerankClient;
use teifleet_proto::v1::tokenize_client::TokenizeClient;
use teifleet_proto::v1::{
    DecodeRequest, EncodeRequest, InfoRequest, ModelType, PredictPairRequest, PredictRequest, RerankRequest,
    RerankStreamRequest,
};
use teifleet_tei_sim::SimConfig;
use tonic::Code;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

use crate::common::{bounded, channel, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_describes_the_configuration() {
    bounded(async {
        let config = SimConfig {
            max_concurrent_requests: 7,
            max_batch_requests: Some(5),
            model_id: "acme/model".into(),
            ..SimConfig::default()
        };
        let sim = start(config).await;
        let info = InfoClient::new(channel(&sim).await).info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.model_id, "acme/model");
        assert_eq!(info.model_type(), ModelType::Embedding);
        assert_eq!(info.max_concurrent_requests, 7);
        assert_eq!(info.max_batch_tokens, 16384);
        assert_eq!(info.max_batch_requests, Some(5));
        assert_eq!(info.max_client_batch_size, 32);
        assert_eq!(info.max_input_length, 512);
        assert_eq!(info.model_dtype, "float16");
        assert_eq!(info.tokenization_workers, 1);
        assert!(info.version.starts_with("sim-"));
        let stats = sim.stats();
        assert_eq!((stats.requests_received, stats.requests_admitted, stats.completed), (1, 0, 1));
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_decode() {
    bounded(async {
        let sim = start(SimConfig::default()).await;
        let mut client = TokenizeClient::new(channel(&sim).await);
        let request = EncodeRequest { inputs: "hello  wide world".into(), add_special_tokens: true, prompt_name: None };
        let tokens = client.tokenize(request.clone()).await.unwrap().into_inner().tokens;
        assert_eq!(tokens.len(), 5);
        assert!(tokens[0].special && tokens[4].special);
        assert_eq!((tokens[0].text.as_str(), tokens[0].start), ("[CLS]", None));
        assert_eq!((tokens[1].text.as_str(), tokens[1].start, tokens[1].stop), ("hello", Some(0), Some(5)));
        assert_eq!((tokens[2].text.as_str(), tokens[2].start, tokens[2].stop), ("wide", Some(7), Some(11)));
        assert!(tokens[1..4].iter().all(|t| !t.special && t.id < 30522));
        assert_eq!(tokens, client.tokenize(request).await.unwrap().into_inner().tokens);

        let plain = EncodeRequest { inputs: "hello".into(), add_special_tokens: false, prompt_name: None };
        assert_eq!(client.tokenize(plain).await.unwrap().into_inner().tokens.len(), 1);

        let ids: Vec<u32> = tokens.iter().map(|t| t.id).collect();
        let decoded = client.decode(DecodeRequest { ids: ids.clone(), skip_special_tokens: true }).await.unwrap();
        assert_eq!(decoded.into_inner().text, format!("tok{} tok{} tok{}", ids[1], ids[2], ids[3]));

        let outbound =
            futures::stream::iter(["a b", "c"].map(|t| EncodeRequest { inputs: t.into(), ..Default::default() }));
        let streamed: Vec<_> = client.tokenize_stream(outbound).await.unwrap().into_inner().collect().await;
        let lengths: Vec<usize> = streamed.into_iter().map(|r| r.unwrap().tokens.len()).collect();
        assert_eq!(lengths, [2, 1]);

        let outbound = futures::stream::iter([DecodeRequest { ids: vec![101, 2000, 102], skip_special_tokens: false }]);
        let mut decoded = client.decode_stream(outbound).await.unwrap().into_inner();
        assert_eq!(decoded.next().await.unwrap().unwrap().text, "[CLS] tok2000 [SEP]");
        // Tokenize needs no slot.
        assert_eq!(sim.stats().requests_admitted, 0);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_orders_by_relevance() {
    bounded(async {
        let sim = start(SimConfig { max_client_batch_size: 3, ..SimConfig::default() }).await;
        let mut client = RerankClient::new(channel(&sim).await);
        let texts = vec!["bread recipe".to_owned(), "async rust runtime".to_owned(), "rust".to_owned()];
        let request =
            RerankRequest { query: "rust async".into(), texts: texts.clone(), return_text: true, ..Default::default() };
        let answer = client.rerank(request.clone()).await.unwrap().into_inner();
        let order: Vec<u32> = answer.ranks.iter().map(|r| r.index).collect();
        assert_eq!(order, [1, 2, 0]);
        assert_eq!(answer.ranks[0].text.as_deref(), Some("async rust runtime"));
        assert!(answer.ranks.iter().all(|r| (0.0..=1.0).contains(&r.score)));
        assert!(answer.metadata.unwrap().inference_time_ns > 0);

        let too_many = RerankRequest { texts: vec!["a".into(); 4], ..request.clone() };
        assert_eq!(client.rerank(too_many).await.unwrap_err().code(), Code::InvalidArgument);

        let outbound = futures::stream::iter(texts.into_iter().map(|text| RerankStreamRequest {
            query: "rust async".into(),
            text,
            ..Default::default()
        }));
        let streamed = client.rerank_stream(outbound).await.unwrap().into_inner();
        let streamed_order: Vec<u32> = streamed.ranks.iter().map(|r| r.index).collect();
        assert_eq!(streamed_order, order);
        assert!(streamed.ranks.iter().all(|r| r.text.is_none()));
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predict_is_deterministic() {
    bounded(async {
        let sim = start(SimConfig::default()).await;
        let mut client = PredictClient::new(channel(&sim).await);
        let request = PredictRequest { inputs: "I love it".into(), ..Default::default() };
        let first = client.predict(request.clone()).await.unwrap().into_inner();
        let second = client.predict(request).await.unwrap().into_inner();
        assert_eq!(first.predictions, second.predictions);
        assert_eq!(first.predictions.len(), 2);
        let total: f32 = first.predictions.iter().map(|p| p.score).sum();
        assert!((total - 1.0).abs() < 1e-4);

        let pair = PredictPairRequest { inputs: vec!["a".into(), "b".into()], ..Default::default() };
        assert_eq!(client.predict_pair(pair).await.unwrap().into_inner().predictions.len(), 2);
        let bad = PredictPairRequest { inputs: vec!["a".into(); 3], ..Default::default() };
        assert_eq!(client.predict_pair(bad).await.unwrap_err().code(), Code::InvalidArgument);

        let outbound = futures::stream::iter([PredictRequest { inputs: "x".into(), ..Default::default() }]);
        let streamed: Vec<_> = client.predict_stream(outbound).await.unwrap().into_inner().collect().await;
        assert_eq!(streamed.len(), 1);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_tei_services() {
    bounded(async {
        let sim = start(SimConfig::default()).await;
        let mut client = ServerReflectionClient::new(channel(&sim).await);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut responses = client.server_reflection_info(futures::stream::iter([request])).await.unwrap().into_inner();
        let Some(MessageResponse::ListServicesResponse(list)) =
            responses.next().await.unwrap().unwrap().message_response
        else {
            panic!("expected a service list");
        };
        let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        for expected in ["tei.v1.Info", "tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank", "tei.v1.Tokenize"] {
            assert!(names.iter().any(|n| n == expected), "{names:?}");
        }
        sim.shutdown().await;
    })
    .await;
}
