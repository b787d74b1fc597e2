//! The client's own data of a training or sampling call — datums in, per-datum outputs and
//! sampled sequences out — and their conversion to and from the wire (`proto.rs`,
//! `types.rs`). Callers never see wire bytes.

use std::collections::{BTreeMap, HashMap};

use crate::proto::{self, ProtoError, Values};
use crate::types;

/// One loss input array.
#[derive(Clone, Debug, PartialEq)]
pub enum LossInput {
    /// `weights`, `logprobs`, `advantages`, … (FLOAT32 on the wire).
    F32(Vec<f32>),
    /// `target_tokens` (INT64 on the wire).
    I64(Vec<i64>),
}

impl LossInput {
    fn len(&self) -> usize {
        match self {
            LossInput::F32(v) => v.len(),
            LossInput::I64(v) => v.len(),
        }
    }
}

/// One training example: the input tokens and, per input position, the loss inputs. The
/// server predicts `target_tokens[i]` from `model_input[..=i]`, so every loss input has
/// one value per input token.
#[derive(Clone, Debug, PartialEq)]
pub struct Datum {
    pub model_input: Vec<i32>,
    pub loss_fn_inputs: BTreeMap<String, LossInput>,
}

impl Datum {
    /// A `cross_entropy` datum: the loss is `-weights[i] * logp(target_tokens[i])`.
    pub fn cross_entropy(
        model_input: Vec<i32>,
        target_tokens: Vec<i64>,
        weights: Vec<f32>,
    ) -> Datum {
        Datum {
            model_input,
            loss_fn_inputs: BTreeMap::from([
                ("target_tokens".to_string(), LossInput::I64(target_tokens)),
                ("weights".to_string(), LossInput::F32(weights)),
            ]),
        }
    }

    /// A policy-gradient datum (`importance_sampling`, `ppo`, `cispo`): the behaviour
    /// policy's log-probs of the targets and per-token advantages. Without `weights` the
    /// server weighs every position 1 (SkyRL's `Datum.to_types`), so pass 0 for prompt
    /// positions.
    pub fn policy_gradient(
        model_input: Vec<i32>,
        target_tokens: Vec<i64>,
        sampling_logprobs: Vec<f32>,
        advantages: Vec<f32>,
        weights: Option<Vec<f32>>,
    ) -> Datum {
        let mut loss_fn_inputs = BTreeMap::from([
            ("target_tokens".to_string(), LossInput::I64(target_tokens)),
            ("logprobs".to_string(), LossInput::F32(sampling_logprobs)),
            ("advantages".to_string(), LossInput::F32(advantages)),
        ]);
        if let Some(w) = weights {
            loss_fn_inputs.insert("weights".to_string(), LossInput::F32(w));
        }
        Datum {
            model_input,
            loss_fn_inputs,
        }
    }

    /// Every loss input must have one value per input token: the server pads them to the
    /// input's length and would silently misalign a shorter one.
    pub(crate) fn check(&self, index: usize) -> Result<(), String> {
        if self.model_input.is_empty() {
            return Err(format!("datum {index}: empty model input"));
        }
        if !self.loss_fn_inputs.contains_key("target_tokens") {
            return Err(format!("datum {index}: no target_tokens"));
        }
        for (name, v) in &self.loss_fn_inputs {
            if v.len() != self.model_input.len() {
                return Err(format!(
                    "datum {index}: {name} has {} values for {} input tokens",
                    v.len(),
                    self.model_input.len()
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn to_proto(&self) -> proto::Datum {
        let loss_fn_inputs: HashMap<String, proto::Tensor> = self
            .loss_fn_inputs
            .iter()
            .map(|(k, v)| {
                let t = match v {
                    LossInput::F32(v) => proto::tensor_f32(v),
                    LossInput::I64(v) => proto::tensor_i64(v),
                };
                (k.clone(), t)
            })
            .collect();
        proto::Datum {
            model_input: vec![proto::text_chunk(&self.model_input)],
            loss_fn_inputs,
        }
    }
}

/// What forward/forward_backward returns for one datum.
#[derive(Clone, Debug, PartialEq)]
pub struct DatumOutput {
    /// Every field the server sent (SkyRL: `elementwise_loss` and `logprobs`).
    pub fields: BTreeMap<String, Values>,
}

impl DatumOutput {
    /// A float field, if the server sent it.
    pub fn f32_field(&self, name: &str) -> Option<Vec<f32>> {
        self.fields.get(name).map(Values::to_f32)
    }

    /// The current policy's log-prob of each target token.
    pub fn logprobs(&self) -> Option<Vec<f32>> {
        self.f32_field("logprobs")
    }

    /// The per-token loss (weights applied; not yet averaged).
    pub fn elementwise_loss(&self) -> Option<Vec<f32>> {
        self.f32_field("elementwise_loss")
    }
}

/// The result of forward/forward_backward.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardOutput {
    pub loss_fn_output_type: String,
    /// One per datum, in request order.
    pub outputs: Vec<DatumOutput>,
    pub metrics: BTreeMap<String, f64>,
}

impl ForwardOutput {
    pub(crate) fn from_proto(
        out: proto::ForwardBackwardOutput,
    ) -> Result<ForwardOutput, ProtoError> {
        let mut outputs = Vec::new();
        // Each record holds a batch of datums; records follow one another in datum order.
        for record in &out.loss_fn_outputs {
            let n = usize::try_from(record.num_datums).unwrap_or(0);
            let mut batch: Vec<DatumOutput> = (0..n)
                .map(|_| DatumOutput {
                    fields: BTreeMap::new(),
                })
                .collect();
            for (name, bt) in &record.fields {
                for (i, values) in bt.split(record.num_datums, name)?.into_iter().enumerate() {
                    batch[i].fields.insert(name.clone(), values);
                }
            }
            outputs.extend(batch);
        }
        Ok(ForwardOutput {
            loss_fn_output_type: out.loss_fn_output_type,
            outputs,
            metrics: out.metrics.into_iter().collect(),
        })
    }

    pub(crate) fn from_json(out: types::ForwardBackwardJson) -> ForwardOutput {
        let outputs = out
            .loss_fn_outputs
            .into_iter()
            .map(|fields| DatumOutput {
                fields: fields
                    .into_iter()
                    .map(|(k, t)| {
                        let v = if t.dtype.as_deref() == Some("int64") {
                            Values::I64(t.data.iter().map(|&x| x as i64).collect())
                        } else {
                            Values::F32(t.data.iter().map(|&x| x as f32).collect())
                        };
                        (k, v)
                    })
                    .collect(),
            })
            .collect();
        ForwardOutput {
            loss_fn_output_type: out.loss_fn_output_type.unwrap_or_default(),
            outputs,
            metrics: out
                .metrics
                .into_iter()
                .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
                .collect(),
        }
    }
}

/// Why a sampled sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token (included in the tokens).
    Stop,
    /// `max_tokens` reached.
    Length,
}

/// One sampled continuation.
#[derive(Clone, Debug, PartialEq)]
pub struct Sequence {
    pub tokens: Vec<i32>,
    /// One per token, when the server sent them.
    pub logprobs: Option<Vec<f32>>,
    pub stop_reason: StopReason,
}

/// The result of a sample request.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleOutput {
    pub sequences: Vec<Sequence>,
    /// One per prompt token when asked for; `None` where undefined (the first token).
    pub prompt_logprobs: Option<Vec<Option<f32>>>,
}

impl SampleOutput {
    pub(crate) fn from_proto(out: proto::SampleResponse) -> Result<SampleOutput, ProtoError> {
        let mut sequences = Vec::with_capacity(out.sequences.len());
        for s in &out.sequences {
            let stop_reason = match s.stop_reason() {
                proto::StopReason::Stop => StopReason::Stop,
                proto::StopReason::Length => StopReason::Length,
            };
            sequences.push(Sequence {
                tokens: proto::decode_i32(&s.tokens, "tokens")?,
                logprobs: s
                    .logprobs
                    .as_deref()
                    .map(|b| proto::decode_f32(b, "logprobs"))
                    .transpose()?,
                stop_reason,
            });
        }
        let prompt_logprobs = out
            .prompt_logprobs
            .as_deref()
            .map(|b| proto::decode_f32(b, "prompt_logprobs"))
            .transpose()?
            .map(|v| v.into_iter().map(|x| (!x.is_nan()).then_some(x)).collect());
        Ok(SampleOutput {
            sequences,
            prompt_logprobs,
        })
    }

    pub(crate) fn from_json(out: types::SampleJson) -> SampleOutput {
        SampleOutput {
            sequences: out
                .sequences
                .into_iter()
                .map(|s| Sequence {
                    tokens: s.tokens,
                    logprobs: s.logprobs,
                    stop_reason: if s.stop_reason.as_deref() == Some("length") {
                        StopReason::Length
                    } else {
                        StopReason::Stop
                    },
                })
                .collect(),
            prompt_logprobs: out.prompt_logprobs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::{encode_f32, encode_i64, ArrayRecord, BatchedTensor, DType};

    #[test]
    fn a_short_loss_input_is_refused() {
        let d = Datum::cross_entropy(vec![1, 2, 3], vec![2, 3, 4], vec![1.0, 1.0]);
        let err = d.check(4).unwrap_err();
        assert!(err.contains("datum 4") && err.contains("weights"), "{err}");
        assert!(Datum::cross_entropy(vec![1], vec![2], vec![1.0])
            .check(0)
            .is_ok());
    }

    #[test]
    fn records_split_into_datums_in_order() {
        let field = |vals: &[f32], offs: &[i64]| BatchedTensor {
            data: encode_f32(vals),
            offsets: encode_i64(offs),
            dtype: DType::Float32 as i32,
            trailing_shape: vec![],
        };
        let out = proto::ForwardBackwardOutput {
            loss_fn_output_type: "scalar".into(),
            loss_fn_outputs: vec![
                ArrayRecord {
                    type_tag: String::new(),
                    fields: HashMap::from([
                        ("logprobs".into(), field(&[-1.0, -2.0, -3.0], &[0, 8, 12])),
                        (
                            "elementwise_loss".into(),
                            field(&[1.0, 2.0, 3.0], &[0, 8, 12]),
                        ),
                    ]),
                    num_datums: 2,
                },
                ArrayRecord {
                    type_tag: String::new(),
                    fields: HashMap::from([("logprobs".into(), field(&[-9.0], &[0, 4]))]),
                    num_datums: 1,
                },
            ],
            metrics: HashMap::from([("m".to_string(), 1.5)]),
        };
        let f = ForwardOutput::from_proto(out).unwrap();
        assert_eq!(f.outputs.len(), 3);
        assert_eq!(f.outputs[0].logprobs(), Some(vec![-1.0, -2.0]));
        assert_eq!(f.outputs[1].elementwise_loss(), Some(vec![3.0]));
        assert_eq!(f.outputs[2].logprobs(), Some(vec![-9.0]));
        assert_eq!(f.outputs[2].elementwise_loss(), None);
        assert_eq!(f.metrics["m"], 1.5);
    }
}
