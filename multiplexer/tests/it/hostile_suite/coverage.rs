//! The table is the product's surfaces, no more, no less: every method of every service the
//! gRPC port serves (the descriptor sets it registers for reflection, and the services its
//! reflection lists), every row of `vocab::rpc::RPCS`, every HTTP route of `front::http::ROUTES`.
//! A surface added without its row fails here, before any attack runs.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use tonic_reflection::pb::{v1, v1alpha};

use super::client::{grpc_call, h2_to, http_call, http_request};
use super::requests;
use super::sidecar::Sidecar;
use super::sim;
use super::table::{GRPC, HTTP, Size};
use crate::support::sim as start_sim;

/// Every method the gRPC port's descriptor sets declare: path -> (client streams, server streams).
fn declared() -> BTreeMap<String, (bool, bool)> {
    let sets = [
        teifleet_proto::TEI_MULTIPLEXER_DESCRIPTOR_SET,
        teifleet_proto::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        v1::FILE_DESCRIPTOR_SET,
        v1alpha::FILE_DESCRIPTOR_SET,
    ];
    let mut methods = BTreeMap::new();
    for set in sets {
        let set = prost_types::FileDescriptorSet::decode(set).expect("a descriptor set");
        for file in &set.file {
            for service in &file.service {
                for method in &service.method {
                    let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                    methods.insert(path, (method.client_streaming(), method.server_streaming()));
                }
            }
        }
    }
    methods
}

fn service_of(path: &str) -> &str {
    path[1..].split('/').next().unwrap_or_default()
}

/// The services the running port's reflection lists, in both versions.
async fn listed(sidecar: &Sidecar) -> BTreeSet<String> {
    let channel = crate::support::channel(sidecar.grpc).await;
    let mut services = BTreeSet::new();
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(String::new())),
    };
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let mut answers = client.server_reflection_info(futures::stream::iter([request])).await.expect("v1").into_inner();
    while let Some(answer) = answers.message().await.expect("v1 answers") {
        if let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
            answer.message_response
        {
            services.extend(list.service.into_iter().map(|s| s.name));
        }
    }
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::ListServices(String::new())),
    };
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let mut answers =
        client.server_reflection_info(futures::stream::iter([request])).await.expect("v1alpha").into_inner();
    while let Some(answer) = answers.message().await.expect("v1alpha answers") {
        if let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
            answer.message_response
        {
            services.extend(list.service.into_iter().map(|s| s.name));
        }
    }
    services
}

#[tokio::test]
async fn every_grpc_method_has_a_row_and_every_row_is_served() {
    let declared = declared();
    let rows: BTreeMap<&str, _> = GRPC.iter().map(|row| (row.path, row)).collect();
    assert_eq!(rows.len(), GRPC.len(), "a path has two rows");
    let missing: Vec<&String> = declared.keys().filter(|path| !rows.contains_key(path.as_str())).collect();
    assert!(
        missing.is_empty(),
        "methods the gRPC port serves without a row in hostile_suite::table::GRPC: {missing:?}"
    );
    for (path, row) in &rows {
        let (client_streams, server_streams) =
            *declared.get(*path).unwrap_or_else(|| panic!("{path}: a row for no method the port declares"));
        assert_eq!(row.client_stream, client_streams, "{path}: the row's client stream is the proto's");
        assert_eq!(row.endless, server_streams && !client_streams, "{path}: only a server stream is endless");
    }
    for rpc in &teifleet_multiplexer::vocab::rpc::RPCS {
        assert!(rows.contains_key(rpc.path), "{}: a row of rpc::RPCS without a row in the suite", rpc.path);
    }

    // What the running port says it serves is what the table covers, and every row is served.
    let sim = start_sim(sim).await;
    let sidecar = Sidecar::start(sim.addr()).await;
    let services: BTreeSet<&str> = declared.keys().map(|path| service_of(path)).collect();
    let listed = listed(&sidecar).await;
    for service in &listed {
        assert!(services.contains(service.as_str()), "{service}: served, and none of its methods has a row");
    }
    let client = h2_to(sidecar.grpc).await.expect("connects");
    for row in GRPC {
        let body = requests::body(row, Size::Cheapest);
        let answer = grpc_call(&client, row, &[], body, super::client::CALL_LIMIT).await;
        let answer = answer.unwrap_or_else(|why| panic!("{}: {why}", row.path));
        assert_eq!(answer.code(), tonic::Code::Ok, "{}: its cheapest valid request is served: {answer:?}", row.path);
    }
    sim.shutdown().await;
}

/// Every route of the HTTP front has a row, every row is a route, and every row's cheapest
/// request is served.
#[tokio::test]
async fn every_http_route_has_a_row_and_every_row_is_served() {
    let routes: BTreeSet<(String, String)> = product_routes();
    let rows: BTreeSet<(String, String)> = HTTP.iter().map(|r| (r.method.to_owned(), r.path.to_owned())).collect();
    assert_eq!(rows.len(), HTTP.len(), "a route has two rows");
    let missing: Vec<_> = routes.difference(&rows).collect();
    assert!(missing.is_empty(), "routes of the HTTP front without a row in hostile_suite::table::HTTP: {missing:?}");
    let gone: Vec<_> = rows.difference(&routes).collect();
    assert!(gone.is_empty(), "rows of hostile_suite::table::HTTP for no route of the HTTP front: {gone:?}");

    let sim = start_sim(sim).await;
    let sidecar = Sidecar::start(sim.addr()).await;
    for row in HTTP {
        let body = super::bodies::body(row, Size::Cheapest);
        let answer = http_call(sidecar.http, &http_request(row.method, row.path, &[], &body)).await;
        let answer = answer.unwrap_or_else(|why| panic!("{} {}: {why}", row.method, row.path));
        let text = String::from_utf8_lossy(&answer.body);
        assert_eq!(answer.status, 200, "{} {}: its cheapest valid request is served: {text}", row.method, row.path);
        // The product's own example of the route's body is served too.
        if let (Some(example), "POST") = (teifleet_multiplexer::front::http::example_body(row.path), row.method) {
            let answer = http_call(sidecar.http, &http_request("POST", row.path, &[], example.as_bytes())).await;
            let answer = answer.unwrap_or_else(|why| panic!("POST {}: {why}", row.path));
            assert_eq!(
                answer.status,
                200,
                "POST {} of its example: {}",
                row.path,
                String::from_utf8_lossy(&answer.body)
            );
        }
    }
    sim.shutdown().await;
}

/// The HTTP front's routes as the product declares them: (method, path).
fn product_routes() -> BTreeSet<(String, String)> {
    use teifleet_multiplexer::front::http::{ROUTES, RouteMethod};
    let mut routes = BTreeSet::new();
    for route in ROUTES {
        let methods: &[&str] = match route.method {
            RouteMethod::Post => &["POST"],
            RouteMethod::Get => &["GET"],
            RouteMethod::PostAndGet => &["POST", "GET"],
        };
        routes.extend(methods.iter().map(|method| (method.to_string(), route.path.to_owned())));
    }
    routes
}
