//! One output batch from a run of input rows and the pool's answer for the embeddable ones among
//! them: each row gets its vector, or a null vector and the reason.

use std::sync::Arc;

use arrow_array::builder::{FixedSizeListBuilder, PrimitiveBuilder};
use arrow_array::cast::AsArray as _;
use arrow_array::types::{Float16Type, Float32Type};
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, FixedSizeListArray, RecordBatch, StringArray};
use arrow_schema::{ArrowError, SchemaRef};

use super::vector_item;
use crate::embed::Answer;
use crate::input::RowText;
use crate::settings::Dtype;

/// What became of one row.
enum Outcome<'a> {
    /// Its vector is row `.0` of the answer.
    Vector(usize),
    Failed(&'a str),
}

/// Why a row the pool answered without a vector or an error failed.
const NO_VECTOR: &str = "the pool answered this row with neither a vector nor an error";

/// Builds the batch for rows `texts` with ids `ids`. `answer` holds one row per
/// [`RowText::Embed`] among them, in order (none when there are none); its vectors must be
/// `dimensions` long (the caller checks).
pub fn assemble(
    schema: &SchemaRef,
    dtype: Dtype,
    dimensions: usize,
    ids: ArrayRef,
    texts: &[RowText],
    answer: Option<&Answer>,
) -> Result<RecordBatch, ArrowError> {
    let mut answered = 0usize;
    let mut outcomes = Vec::with_capacity(texts.len());
    for text in texts {
        let outcome = match (text, answer) {
            (RowText::Failed(reason), _) => Outcome::Failed(reason),
            (RowText::Embed(_), Some(answer)) => {
                let row = answered;
                answered += 1;
                match (answer.embeddings.is_valid(row), answer.errors.is_valid(row)) {
                    (true, false) => Outcome::Vector(row),
                    (_, true) => Outcome::Failed(answer.errors.value(row)),
                    (false, false) => Outcome::Failed(NO_VECTOR),
                }
            }
            (RowText::Embed(_), None) => {
                return Err(ArrowError::InvalidArgumentError("rows to embed without an answer".into()));
            }
        };
        outcomes.push(outcome);
    }
    let embeddings: ArrayRef = match dtype {
        Dtype::F32 => Arc::new(vectors::<Float32Type>(&outcomes, answer, dimensions, dtype)?),
        Dtype::F16 => Arc::new(vectors::<Float16Type>(&outcomes, answer, dimensions, dtype)?),
    };
    let errors: StringArray = outcomes
        .iter()
        .map(|outcome| match outcome {
            Outcome::Vector(_) => None,
            Outcome::Failed(reason) => Some(*reason),
        })
        .collect();
    RecordBatch::try_new(schema.clone(), vec![ids, embeddings, Arc::new(errors)])
}

/// The `embedding` column: each answered vector copied in, zeros under the null of a failed row.
fn vectors<T: ArrowPrimitiveType>(
    outcomes: &[Outcome<'_>],
    answer: Option<&Answer>,
    dimensions: usize,
    dtype: Dtype,
) -> Result<FixedSizeListArray, ArrowError> {
    let values = answer.map(|answer| answer.embeddings.values().as_primitive::<T>());
    let mut builder = FixedSizeListBuilder::with_capacity(
        PrimitiveBuilder::<T>::with_capacity(outcomes.len() * dimensions),
        dimensions as i32,
        outcomes.len(),
    )
    .with_field(vector_item(dtype));
    for outcome in outcomes {
        match (outcome, values, answer) {
            (Outcome::Vector(row), Some(values), Some(answer)) => {
                let start = answer.embeddings.value_offset_at(*row);
                builder.values().append_slice(&values.values()[start..start + dimensions]);
                builder.append(true);
            }
            _ => {
                builder.values().append_value_n(T::Native::default(), dimensions);
                builder.append(false);
            }
        }
    }
    Ok(builder.finish())
}

#[cfg(test)]
mod tests {
    use arrow_array::builder::Float32Builder;
    use arrow_array::{Float32Array, StringArray};
    use arrow_schema::DataType;

    use super::*;
    use crate::output::part_schema;

    fn answer(rows: &[Result<[f32; 2], &str>]) -> Answer {
        let mut builder = FixedSizeListBuilder::new(Float32Builder::new(), 2);
        for row in rows {
            builder.values().append_slice(&row.unwrap_or_default());
            builder.append(row.is_ok());
        }
        let errors: StringArray = rows.iter().map(|row| row.err()).collect();
        Answer { embeddings: builder.finish(), errors }
    }

    #[test]
    fn rows_get_their_vectors_or_their_errors_in_input_order() {
        let texts = [
            RowText::Embed("a".into()),
            RowText::Failed("corpus.jsonl:2: not JSON".into()),
            RowText::Embed("too long".into()),
            RowText::Embed("c".into()),
        ];
        let ids: ArrayRef = Arc::new(StringArray::from(vec![Some("1"), None, Some("3"), Some("4")]));
        let answer = answer(&[Ok([1.0, 2.0]), Err("input too long"), Ok([3.0, 4.0])]);
        let schema = part_schema(&DataType::Utf8, Dtype::F32, 2);
        let batch = assemble(&schema, Dtype::F32, 2, ids, &texts, Some(&answer)).unwrap();

        let embeddings = batch.column(1).as_fixed_size_list();
        let vector =
            |row: usize| embeddings.value(row).as_any().downcast_ref::<Float32Array>().unwrap().values().to_vec();
        assert_eq!(vector(0), [1.0, 2.0]);
        assert_eq!(vector(3), [3.0, 4.0]);
        assert!(embeddings.is_null(1) && embeddings.is_null(2));
        let errors = batch.column(2).as_string::<i32>();
        assert_eq!(
            errors.iter().collect::<Vec<_>>(),
            [None, Some("corpus.jsonl:2: not JSON"), Some("input too long"), None]
        );
    }

    #[test]
    fn a_run_of_failed_rows_needs_no_answer() {
        let texts = [RowText::Failed("`text` is null".into())];
        let ids: ArrayRef = Arc::new(arrow_array::Int64Array::from(vec![7]));
        let schema = part_schema(&DataType::Int64, Dtype::F16, 3);
        let batch = assemble(&schema, Dtype::F16, 3, ids, &texts, None).unwrap();
        assert_eq!(batch.num_rows(), 1);
        assert!(batch.column(1).is_null(0));
        assert_eq!(batch.column(2).as_string::<i32>().value(0), "`text` is null");
    }
}
