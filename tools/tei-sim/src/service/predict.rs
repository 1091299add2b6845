//! The Predict service: a two-label classifier whose answer depends only on the input.

use teifleet_proto::v1::predict_server::Predict;
use teifleet_proto::v1::{PredictPairRequest, PredictRequest, PredictResponse, Prediction};
use tonic::{Request, Response, Status, Streaming};

use super::stream::ResponseStream;
use super::{Admitted, Sim};
use crate::embedding::score;

const LABELS: [&str; 2] = ["LABEL_0", "LABEL_1"];

/// Scores sorted best first, as TEI returns them; probabilities unless `raw_scores`.
fn predictions(text: &str, raw_scores: bool) -> Vec<Prediction> {
    let logit = (score("predict", text) - 0.5) * 8.0;
    let logits = [logit, -logit];
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp_sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    let mut predictions: Vec<Prediction> = LABELS
        .iter()
        .zip(logits)
        .map(|(label, l)| Prediction {
            score: if raw_scores { l } else { (l - max).exp() / exp_sum },
            label: (*label).to_owned(),
        })
        .collect();
    predictions.sort_by(|a, b| b.score.total_cmp(&a.score));
    predictions
}

async fn predict(admitted: Admitted, request: PredictRequest) -> Result<PredictResponse, Status> {
    let direction = request.truncation_direction();
    let inference = admitted.infer(&[&request.inputs], request.truncate, direction).await?;
    let text = inference.sequences.first().map(|s| s.text.as_str()).unwrap_or_default();
    Ok(PredictResponse { predictions: predictions(text, request.raw_scores), metadata: Some(inference.metadata) })
}

async fn predict_pair(admitted: Admitted, request: PredictPairRequest) -> Result<PredictResponse, Status> {
    if !(1..=2).contains(&request.inputs.len()) {
        return Err(Status::invalid_argument(format!(
            "`inputs` must have a single or two elements. Given: {}",
            request.inputs.len()
        )));
    }
    let direction = request.truncation_direction();
    // A pair is one sequence to the model: `[CLS] first [SEP] second [SEP]`.
    let joined = request.inputs.join(" ");
    let inference = admitted.infer(&[&joined], request.truncate, direction).await?;
    let text = inference.sequences.first().map(|s| s.text.as_str()).unwrap_or_default();
    Ok(PredictResponse { predictions: predictions(text, request.raw_scores), metadata: Some(inference.metadata) })
}

#[tonic::async_trait]
impl Predict for Sim {
    async fn predict(&self, request: Request<PredictRequest>) -> Result<Response<PredictResponse>, Status> {
        self.unary(request.into_inner(), predict).await
    }

    async fn predict_pair(&self, request: Request<PredictPairRequest>) -> Result<Response<PredictResponse>, Status> {
        self.unary(request.into_inner(), predict_pair).await
    }

    type PredictStreamStream = ResponseStream<PredictResponse>;

    async fn predict_stream(
        &self,
        request: Request<Streaming<PredictRequest>>,
    ) -> Result<Response<Self::PredictStreamStream>, Status> {
        Ok(Response::new(self.bidi(request.into_inner(), predict)))
    }

    type PredictPairStreamStream = ResponseStream<PredictResponse>;

    async fn predict_pair_stream(
        &self,
        request: Request<Streaming<PredictPairRequest>>,
    ) -> Result<Response<Self::PredictPairStreamStream>, Status> {
        Ok(Response::new(self.bidi(request.into_inner(), predict_pair)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_sum_to_one_and_are_sorted() {
        let p = predictions("some text", false);
        assert_eq!(p.len(), 2);
        assert!((p[0].score + p[1].score - 1.0).abs() < 1e-5);
        assert!(p[0].score >= p[1].score);
        assert_eq!(p, predictions("some text", false));
    }
}
