//! The Rerank service: scores grow with how many query words a text contains, plus a small
//! deterministic jitter so ties are rare.

use std::collections::HashSet;

use teifleet_proto::v1::rerank_server::Rerank;
use teifleet_proto::v1::{Rank, RerankRequest, RerankResponse, RerankStreamRequest, TruncationDirection};
use tonic::{Request, Response, Status, Streaming};

use super::{Admitted, Sim};
use crate::embedding::score;

/// Logit of `text` answering `query`.
fn relevance(query: &str, text: &str) -> f32 {
    let query_words: HashSet<String> = query.split_whitespace().map(str::to_lowercase).collect();
    let text_words: HashSet<String> = text.split_whitespace().map(str::to_lowercase).collect();
    let overlap = if query_words.is_empty() {
        0.0
    } else {
        query_words.intersection(&text_words).count() as f32 / query_words.len() as f32
    };
    let jitter = score("rerank", &format!("{query}\u{1f}{text}")) - 0.5;
    overlap * 8.0 - 4.0 + jitter
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

struct Ranking<'a> {
    query: &'a str,
    texts: &'a [String],
    truncate: bool,
    raw_scores: bool,
    return_text: bool,
    direction: TruncationDirection,
}

async fn rank(admitted: Admitted, ranking: Ranking<'_>) -> Result<RerankResponse, Status> {
    if ranking.texts.is_empty() {
        return Err(Status::invalid_argument("`texts` cannot be empty"));
    }
    let max = admitted.max_client_batch_size();
    if ranking.texts.len() > max {
        return Err(Status::invalid_argument(format!(
            "batch size {} > maximum allowed batch size {max}",
            ranking.texts.len()
        )));
    }
    // Each (query, text) pair is one sequence to a cross-encoder.
    let pairs: Vec<String> = ranking.texts.iter().map(|t| format!("{} {t}", ranking.query)).collect();
    let inputs: Vec<&str> = pairs.iter().map(String::as_str).collect();
    let inference = admitted.infer(&inputs, ranking.truncate, ranking.direction).await?;
    let mut ranks: Vec<Rank> = ranking
        .texts
        .iter()
        .enumerate()
        .map(|(index, text)| {
            let logit = relevance(ranking.query, text);
            Rank {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                text: ranking.return_text.then(|| text.clone()),
                score: if ranking.raw_scores { logit } else { sigmoid(logit) },
            }
        })
        .collect();
    ranks.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.index.cmp(&b.index)));
    Ok(RerankResponse { ranks, metadata: Some(inference.metadata) })
}

#[tonic::async_trait]
impl Rerank for Sim {
    async fn rerank(&self, request: Request<RerankRequest>) -> Result<Response<RerankResponse>, Status> {
        self.unary(request.into_inner(), |admitted, request: RerankRequest| async move {
            let ranking = Ranking {
                query: &request.query,
                texts: &request.texts,
                truncate: request.truncate,
                raw_scores: request.raw_scores,
                return_text: request.return_text,
                direction: request.truncation_direction(),
            };
            rank(admitted, ranking).await
        })
        .await
    }

    /// Client streaming: every message counts as received; the ranking, once the client is done,
    /// waits for a slot like any streamed request.
    async fn rerank_stream(
        &self,
        request: Request<Streaming<RerankStreamRequest>>,
    ) -> Result<Response<RerankResponse>, Status> {
        let mut inbound = request.into_inner();
        let result = async {
            let mut first: Option<(RerankStreamRequest, tokio::time::Instant)> = None;
            let mut texts = Vec::new();
            while let Some(mut message) = inbound.message().await? {
                let received = self.receive(true)?;
                texts.push(std::mem::take(&mut message.text));
                first.get_or_insert((message, received));
            }
            let Some((first, received)) = first else {
                return Err(Status::invalid_argument("`texts` cannot be empty"));
            };
            let slot = self.admit().await?;
            let admitted = Admitted { sim: self.clone(), _slot: slot, received };
            let ranking = Ranking {
                query: &first.query,
                texts: &texts,
                truncate: first.truncate,
                raw_scores: first.raw_scores,
                return_text: first.return_text,
                direction: first.truncation_direction(),
            };
            rank(admitted, ranking).await
        }
        .await;
        self.record(&result, true);
        result.map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_ranks_higher() {
        assert!(relevance("rust async", "async rust runtime") > relevance("rust async", "a recipe for bread"));
        assert!(sigmoid(relevance("q", "q")) > 0.5);
    }
}
