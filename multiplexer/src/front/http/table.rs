//! Every route of the HTTP front, in one table the router is built from: a new route is a new row,
//! and whatever reads the table (the key gate's exemptions, the error flavor, the hostile suite in
//! `tests/it`) meets it the day it is added.

use axum::routing::{MethodRouter, get, post};

use super::Shared;
use super::error::Flavor;
use super::routes;

/// The methods a route answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteMethod {
    Post,
    Get,
    /// `POST` does the work, `GET` is a health check (TEI's `/`).
    PostAndGet,
}

/// What a route is, as far as an attacker (and the key gate) cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteKind {
    /// Work for the pool: a body of inputs, sent upstream as calls of `rpc` (a path of
    /// `crate::vocab::rpc::RPCS`, the one it is counted as until it says otherwise).
    Inference { rpc: &'static str },
    /// The pool's Info: no body, one cached upstream call.
    Info,
    /// Readiness: no body, no key, nothing upstream.
    Health,
}

/// One row of [`ROUTES`].
pub struct Route {
    pub path: &'static str,
    pub method: RouteMethod,
    pub kind: RouteKind,
    /// The shape its refusals take: OpenAI's clients read OpenAI's.
    pub flavor: Flavor,
    /// A valid body of the route's `POST` (what [`example_body`] gives).
    pub example: Option<&'static str>,
    make: fn() -> MethodRouter<Shared>,
}

impl Route {
    /// The route's handlers.
    pub fn handlers(&self) -> MethodRouter<Shared> {
        (self.make)()
    }

    /// Whether `GET` on it is a health check, which probes and load balancers call without a key
    /// (TEI's `GET /` is one).
    pub fn keyless_get(&self) -> bool {
        match self.method {
            RouteMethod::PostAndGet => true,
            RouteMethod::Get => self.kind == RouteKind::Health,
            RouteMethod::Post => false,
        }
    }
}

const EMBED: &str = "/tei.v1.Embed/Embed";
const EMBED_SPARSE: &str = "/tei.v1.Embed/EmbedSparse";
const EMBED_ALL: &str = "/tei.v1.Embed/EmbedAll";
const PREDICT: &str = "/tei.v1.Predict/Predict";
const RERANK: &str = "/tei.v1.Rerank/Rerank";
const TOKENIZE: &str = "/tei.v1.Tokenize/Tokenize";
const DECODE: &str = "/tei.v1.Tokenize/Decode";

const TEXTS: &str = r#"{"inputs":["What is Deep Learning?","Deep learning is a subset of machine learning."]}"#;
const TEXT: &str = r#"{"inputs":"What is Deep Learning?"}"#;
const OPENAI: &str = r#"{"input":["What is Deep Learning?","Deep learning is a subset of machine learning."]}"#;

const fn inference(
    path: &'static str,
    rpc: &'static str,
    example: &'static str,
    make: fn() -> MethodRouter<Shared>,
) -> Route {
    let kind = RouteKind::Inference { rpc };
    Route { path, method: RouteMethod::Post, kind, flavor: Flavor::Tei, example: Some(example), make }
}

/// Every route of the HTTP front. `/` and `/invocations` serve what the model's type calls for
/// (`/embed` for the example body an embedding model takes).
pub const ROUTES: &[Route] = &[
    Route {
        path: "/",
        method: RouteMethod::PostAndGet,
        kind: RouteKind::Inference { rpc: EMBED },
        flavor: Flavor::Tei,
        example: Some(TEXT),
        make: || post(routes::dispatch).get(routes::health),
    },
    inference("/invocations", EMBED, TEXT, || post(routes::dispatch)),
    inference("/embed", EMBED, TEXTS, || post(routes::embed)),
    inference("/embed_sparse", EMBED_SPARSE, TEXTS, || post(routes::embed_sparse)),
    inference("/embed_all", EMBED_ALL, TEXTS, || post(routes::embed_all)),
    inference("/predict", PREDICT, r#"{"inputs":["I like you.","I love you."]}"#, || post(routes::predict)),
    inference(
        "/rerank",
        RERANK,
        r#"{"query":"What is Deep Learning?","texts":["Deep Learning is not...","Deep learning is..."]}"#,
        || post(routes::rerank),
    ),
    inference(
        "/similarity",
        EMBED,
        r#"{"inputs":{"source_sentence":"What is Deep Learning?","sentences":["What is Machine Learning?"]}}"#,
        || post(routes::similarity),
    ),
    inference("/tokenize", TOKENIZE, TEXT, || post(routes::tokenize)),
    inference("/decode", DECODE, r#"{"ids":[101,2054,2003,2784,4083,1029,102]}"#, || post(routes::decode)),
    Route {
        path: "/info",
        method: RouteMethod::Get,
        kind: RouteKind::Info,
        flavor: Flavor::Tei,
        example: None,
        make: || get(routes::info),
    },
    health("/health"),
    health("/ping"),
    openai("/v1/embeddings"),
    openai("/embeddings"),
];

const fn health(path: &'static str) -> Route {
    let make = || get(routes::health);
    Route { path, method: RouteMethod::Get, kind: RouteKind::Health, flavor: Flavor::Tei, example: None, make }
}

const fn openai(path: &'static str) -> Route {
    let kind = RouteKind::Inference { rpc: EMBED };
    let make = || post(routes::openai);
    Route { path, method: RouteMethod::Post, kind, flavor: Flavor::OpenAi, example: Some(OPENAI), make }
}

/// The row of `path`.
pub fn route(path: &str) -> Option<&'static Route> {
    ROUTES.iter().find(|route| route.path == path)
}

/// A valid body for `POST path`, or `None` for a route that takes no body (or no such route).
pub fn example_body(path: &str) -> Option<&'static str> {
    route(path)?.example
}

/// The shape of `path`'s refusals (TEI's for a path that is no route).
pub fn flavor(path: &str) -> Flavor {
    route(path).map_or(Flavor::Tei, |route| route.flavor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_one_row_and_every_body_route_has_an_example_that_parses() {
        let mut paths: Vec<_> = ROUTES.iter().map(|route| route.path).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), ROUTES.len(), "one row per path");
        for route in ROUTES {
            let posts = matches!(route.method, RouteMethod::Post | RouteMethod::PostAndGet);
            assert_eq!(posts, route.example.is_some(), "{}: an example exactly for a POST", route.path);
            if let Some(body) = route.example {
                serde_json::from_str::<serde_json::Value>(body).expect("JSON");
            }
            if let RouteKind::Inference { rpc } = route.kind {
                assert!(crate::vocab::rpc::find(rpc).is_some(), "{}: {rpc} is a row of the RPC table", route.path);
            }
        }
        let keyless: Vec<_> = ROUTES.iter().filter(|route| route.keyless_get()).map(|route| route.path).collect();
        assert_eq!(keyless, ["/", "/health", "/ping"]);
        assert!(matches!(flavor("/v1/embeddings"), Flavor::OpenAi) && matches!(flavor("/embed"), Flavor::Tei));
        assert_eq!(example_body("/info"), None);
        assert!(example_body("/rerank").is_some_and(|body| body.contains("query")));
    }
}
