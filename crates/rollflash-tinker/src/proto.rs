//! The protobuf part of the Tinker protocol: the request body of `forward_backward` and the
//! results of forward/forward_backward and sample, with their byte conventions.
//!
//! The messages are the subset of the tinker SDK's `tinker_public.proto` (package
//! `tinker_public`, proto3) that a client of an open server needs, written by hand with
//! `prost`'s derives so the build needs no `protoc`. Field numbers and types follow the SDK
//! 0.25.0 descriptor (SkyRL 0.4.0 parses with that one); the 0.38 additions are left out, and
//! proto3 skips fields a peer does not know. Byte conventions (the SDK's `request_conv.py` and
//! `response_conv.py`):
//! - prompt tokens in [`EncodedTextChunk::tokens`] and sampled tokens are int32 little-endian;
//! - a [`Tensor`]'s `dense` bytes are the little-endian values in its dtype (the SDK writes
//!   only FLOAT32 and INT64; SkyRL accepts only those two);
//! - a [`BatchedTensor`] concatenates one array per datum, and its `offsets` are
//!   `num_datums + 1` int64 little-endian *byte* offsets into `data`;
//! - logprobs are f32 little-endian; undefined prompt logprobs are NaN.

use std::collections::HashMap;

/// The protobuf media type: the `Content-Type` of a `forward_backward` body, and of the
/// results that come back as protobuf.
pub const CONTENT_TYPE: &str = "application/x-protobuf";

/// Element type of a [`Tensor`] or [`BatchedTensor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum DType {
    Unspecified = 0,
    Float32 = 1,
    Int64 = 2,
    Int32 = 3,
    /// Sent as the top 16 bits of an f32.
    Bfloat16 = 4,
}

/// Why a sampled sequence ended. proto3 makes the first value the default, so a sequence
/// that says nothing stopped on a stop token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum StopReason {
    Stop = 0,
    Length = 1,
}

/// The `forward_backward` request body (also forward-only, through `forward_only`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardBackwardRequest {
    #[prost(string, tag = "1")]
    pub model_id: String,
    /// The per-model idempotency key: the same `(model_id, seq_id)` gets back the same
    /// future. 0 means "none" on the wire (SkyRL reads `seq_id or None`).
    #[prost(int32, tag = "2")]
    pub seq_id: i32,
    #[prost(message, repeated, tag = "3")]
    pub data: Vec<Datum>,
    #[prost(string, tag = "4")]
    pub loss_fn: String,
    #[prost(map = "string, double", tag = "5")]
    pub loss_fn_config: HashMap<String, f64>,
    #[prost(bool, tag = "6")]
    pub forward_only: bool,
}

/// One training example: the model input and the loss inputs (`target_tokens`, `weights`,
/// `logprobs`, `advantages`, …).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Datum {
    #[prost(message, repeated, tag = "1")]
    pub model_input: Vec<Chunk>,
    #[prost(map = "string, message", tag = "2")]
    pub loss_fn_inputs: HashMap<String, Tensor>,
}

/// One chunk of model input. Only text is spoken here; image (2) and dmel (3) chunks of
/// the SDK's oneof are left out.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Chunk {
    #[prost(oneof = "chunk::Chunk", tags = "1")]
    pub chunk: Option<chunk::Chunk>,
}

/// The oneof of [`Chunk`](struct@Chunk).
pub mod chunk {
    /// Which kind of chunk.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Chunk {
        #[prost(message, tag = "1")]
        EncodedText(super::EncodedTextChunk),
    }
}

/// Token ids, int32 little-endian.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EncodedTextChunk {
    #[prost(bytes = "vec", tag = "1")]
    pub tokens: Vec<u8>,
}

/// A loss input array.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Tensor {
    #[prost(oneof = "tensor::Encoding", tags = "1, 2")]
    pub encoding: Option<tensor::Encoding>,
    #[prost(enumeration = "DType", tag = "3")]
    pub dtype: i32,
    #[prost(int64, repeated, tag = "4")]
    pub shape: Vec<i64>,
}

/// The oneof of [`Tensor`].
pub mod tensor {
    /// How the values are laid out.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Encoding {
        /// Raw little-endian values in the tensor's dtype.
        #[prost(bytes = "vec", tag = "1")]
        Dense(Vec<u8>),
        /// Kept so a sparse tensor decodes; SkyRL rejects it in requests.
        #[prost(message, tag = "2")]
        SparseCsr(super::SparseCsr),
    }
}

/// A CSR tensor (indices int64 LE).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SparseCsr {
    #[prost(bytes = "vec", tag = "1")]
    pub values: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub crow_indices: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    pub col_indices: Vec<u8>,
}

/// The result of forward/forward_backward.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardBackwardOutput {
    #[prost(string, tag = "1")]
    pub loss_fn_output_type: String,
    #[prost(message, repeated, tag = "2")]
    pub loss_fn_outputs: Vec<ArrayRecord>,
    #[prost(map = "string, double", tag = "3")]
    pub metrics: HashMap<String, f64>,
}

/// Per-datum outputs of a batch of datums, one [`BatchedTensor`] per field name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ArrayRecord {
    #[prost(string, tag = "1")]
    pub type_tag: String,
    #[prost(map = "string, message", tag = "2")]
    pub fields: HashMap<String, BatchedTensor>,
    #[prost(int64, tag = "3")]
    pub num_datums: i64,
}

/// One array per datum, concatenated; datum i is `data[offsets[i]..offsets[i + 1]]` (byte
/// offsets, int64 LE).
#[derive(Clone, PartialEq, prost::Message)]
pub struct BatchedTensor {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub offsets: Vec<u8>,
    #[prost(enumeration = "DType", tag = "3")]
    pub dtype: i32,
    #[prost(int64, repeated, tag = "4")]
    pub trailing_shape: Vec<i64>,
}

/// The result of a sample (asample) request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SampleResponse {
    #[prost(message, repeated, tag = "1")]
    pub sequences: Vec<SampledSequence>,
    /// f32 LE, one per prompt token; the first (which has no context) is NaN.
    #[prost(bytes = "vec", optional, tag = "2")]
    pub prompt_logprobs: Option<Vec<u8>>,
    #[prost(message, optional, tag = "3")]
    pub topk_prompt_logprobs: Option<TopkLogprobs>,
    #[prost(int32, tag = "4")]
    pub prompt_cache_hit_tokens: i32,
}

/// One sampled continuation.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SampledSequence {
    #[prost(enumeration = "StopReason", tag = "1")]
    pub stop_reason: i32,
    /// int32 LE.
    #[prost(bytes = "vec", tag = "2")]
    pub tokens: Vec<u8>,
    /// f32 LE, one per token.
    #[prost(bytes = "vec", optional, tag = "3")]
    pub logprobs: Option<Vec<u8>>,
}

/// Top-k logprobs, row-major `[length, k]`: token ids int32 LE, logprobs f32 LE. (SDK 0.25
/// calls it `TopkPromptLogprobs` and the last field `prompt_length`; same numbers.)
#[derive(Clone, PartialEq, prost::Message)]
pub struct TopkLogprobs {
    #[prost(bytes = "vec", tag = "1")]
    pub token_ids: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub logprobs: Vec<u8>,
    #[prost(uint32, tag = "3")]
    pub k: u32,
    #[prost(uint32, tag = "4")]
    pub length: u32,
}

/// A byte array that is not what its dtype or offsets say.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtoError {
    #[error("{what}: {len} bytes is not a whole number of {width}-byte values")]
    Ragged {
        what: String,
        len: usize,
        width: usize,
    },
    #[error("{what}: offsets {offsets:?} do not cut {len} bytes into {num_datums} datums")]
    BadOffsets {
        what: String,
        offsets: Vec<i64>,
        len: usize,
        num_datums: i64,
    },
    #[error("{what}: unsupported dtype {dtype}")]
    UnsupportedDType { what: String, dtype: i32 },
}

/// Tokens as int32 LE bytes.
pub fn encode_i32(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Values as int64 LE bytes.
pub fn encode_i64(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Values as f32 LE bytes.
pub fn encode_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn chunks<const N: usize>(bytes: &[u8], what: &str) -> Result<Vec<[u8; N]>, ProtoError> {
    if !bytes.len().is_multiple_of(N) {
        return Err(ProtoError::Ragged {
            what: what.to_string(),
            len: bytes.len(),
            width: N,
        });
    }
    Ok(bytes
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            a
        })
        .collect())
}

/// int32 LE bytes back to values.
pub fn decode_i32(bytes: &[u8], what: &str) -> Result<Vec<i32>, ProtoError> {
    Ok(chunks::<4>(bytes, what)?
        .into_iter()
        .map(i32::from_le_bytes)
        .collect())
}

/// int64 LE bytes back to values.
pub fn decode_i64(bytes: &[u8], what: &str) -> Result<Vec<i64>, ProtoError> {
    Ok(chunks::<8>(bytes, what)?
        .into_iter()
        .map(i64::from_le_bytes)
        .collect())
}

/// f32 LE bytes back to values.
pub fn decode_f32(bytes: &[u8], what: &str) -> Result<Vec<f32>, ProtoError> {
    Ok(chunks::<4>(bytes, what)?
        .into_iter()
        .map(f32::from_le_bytes)
        .collect())
}

/// bf16 (the top half of an f32, LE u16) widened to f32.
pub fn decode_bf16(bytes: &[u8], what: &str) -> Result<Vec<f32>, ProtoError> {
    Ok(chunks::<2>(bytes, what)?
        .into_iter()
        .map(|b| f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16))
        .collect())
}

/// The values of one datum's slice of a [`BatchedTensor`], in the two shapes a caller
/// wants: floats (f32 and bf16) and integers (int32 widened, as the SDK does, and int64).
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

impl Values {
    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::I64(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32 (integers converted), for fields a caller reads as floats.
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            Values::F32(v) => v.clone(),
            Values::I64(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }
}

fn decode_values(bytes: &[u8], dtype: i32, what: &str) -> Result<Values, ProtoError> {
    match DType::try_from(dtype) {
        Ok(DType::Float32) => decode_f32(bytes, what).map(Values::F32),
        Ok(DType::Bfloat16) => decode_bf16(bytes, what).map(Values::F32),
        Ok(DType::Int64) => decode_i64(bytes, what).map(Values::I64),
        Ok(DType::Int32) => {
            decode_i32(bytes, what).map(|v| Values::I64(v.into_iter().map(i64::from).collect()))
        }
        Ok(DType::Unspecified) | Err(_) => Err(ProtoError::UnsupportedDType {
            what: what.to_string(),
            dtype,
        }),
    }
}

impl BatchedTensor {
    /// Splits the concatenated data into one array per datum, by the byte offsets.
    pub fn split(&self, num_datums: i64, what: &str) -> Result<Vec<Values>, ProtoError> {
        let offsets = decode_i64(&self.offsets, what)?;
        let bad = || ProtoError::BadOffsets {
            what: what.to_string(),
            offsets: offsets.clone(),
            len: self.data.len(),
            num_datums,
        };
        let n = usize::try_from(num_datums).map_err(|_| bad())?;
        if offsets.len() != n + 1 {
            return Err(bad());
        }
        let mut out = Vec::with_capacity(n);
        for w in offsets.windows(2) {
            let (a, b) = (usize::try_from(w[0]), usize::try_from(w[1]));
            let (Ok(a), Ok(b)) = (a, b) else {
                return Err(bad());
            };
            if a > b || b > self.data.len() {
                return Err(bad());
            }
            out.push(decode_values(&self.data[a..b], self.dtype, what)?);
        }
        Ok(out)
    }
}

/// A dense 1-D f32 loss input (`weights`, `logprobs`, `advantages`).
pub fn tensor_f32(values: &[f32]) -> Tensor {
    Tensor {
        encoding: Some(tensor::Encoding::Dense(encode_f32(values))),
        dtype: DType::Float32 as i32,
        shape: vec![values.len() as i64],
    }
}

/// A dense 1-D int64 loss input (`target_tokens`).
pub fn tensor_i64(values: &[i64]) -> Tensor {
    Tensor {
        encoding: Some(tensor::Encoding::Dense(encode_i64(values))),
        dtype: DType::Int64 as i32,
        shape: vec![values.len() as i64],
    }
}

/// A model input of one text chunk.
pub fn text_chunk(tokens: &[i32]) -> Chunk {
    Chunk {
        chunk: Some(chunk::Chunk::EncodedText(EncodedTextChunk {
            tokens: encode_i32(tokens),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn forward_backward_request_round_trips() {
        let mut inputs = HashMap::new();
        inputs.insert("target_tokens".to_string(), tensor_i64(&[5, 6, 7]));
        inputs.insert("weights".to_string(), tensor_f32(&[0.0, 1.0, 1.0]));
        let req = ForwardBackwardRequest {
            model_id: "model_1".into(),
            seq_id: 3,
            data: vec![Datum {
                model_input: vec![text_chunk(&[1, 5, 6])],
                loss_fn_inputs: inputs,
            }],
            loss_fn: "cross_entropy".into(),
            loss_fn_config: HashMap::from([("clip_low_threshold".to_string(), 0.8)]),
            forward_only: true,
        };
        let bytes = req.encode_to_vec();
        let back = ForwardBackwardRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(back, req);
        let Some(chunk::Chunk::EncodedText(t)) = &back.data[0].model_input[0].chunk else {
            panic!("not a text chunk")
        };
        assert_eq!(decode_i32(&t.tokens, "tokens").unwrap(), vec![1, 5, 6]);
    }

    /// The exact bytes protobuf gives for a small request, worked out by hand from the
    /// schema: a change of tag or wire type shows up here, not only on a live server.
    #[test]
    fn forward_backward_request_wire_bytes() {
        let req = ForwardBackwardRequest {
            model_id: "m".into(),
            seq_id: 1,
            data: vec![Datum {
                model_input: vec![text_chunk(&[2])],
                loss_fn_inputs: HashMap::new(),
            }],
            loss_fn: "ce".into(),
            loss_fn_config: HashMap::new(),
            forward_only: false,
        };
        // EncodedTextChunk{tokens = 02 00 00 00} is `0a 04 02 00 00 00` (6 bytes), so the Chunk
        // is `0a 06 <6>` (8 bytes) and the Datum `0a 08 <8>` (10 bytes).
        let expected: Vec<u8> = [
            &[0x0a, 1, b'm'][..],                               // 1: model_id
            &[0x10, 1],                                         // 2: seq_id (varint)
            &[0x1a, 10, 0x0a, 8, 0x0a, 6, 0x0a, 4, 2, 0, 0, 0], // 3: data
            &[0x22, 2, b'c', b'e'],                             // 4: loss_fn
        ]
        .concat();
        assert_eq!(req.encode_to_vec(), expected);
    }

    /// The shape of SkyRL's captured forward_backward result for 4 datums (TINKER.md §6.3):
    /// one record with FLOAT32 `elementwise_loss` and `logprobs`, offsets [0,44,76,136,160].
    #[test]
    fn batched_tensor_splits_by_byte_offsets() {
        let lens = [11usize, 8, 15, 6];
        let all: Vec<f32> = (0..40).map(|i| i as f32 * -0.5).collect();
        let bt = BatchedTensor {
            data: encode_f32(&all),
            offsets: encode_i64(&[0, 44, 76, 136, 160]),
            dtype: DType::Float32 as i32,
            trailing_shape: vec![],
        };
        let out = ForwardBackwardOutput {
            loss_fn_output_type: "scalar".into(),
            loss_fn_outputs: vec![ArrayRecord {
                type_tag: String::new(),
                fields: HashMap::from([
                    ("logprobs".to_string(), bt.clone()),
                    ("elementwise_loss".to_string(), bt),
                ]),
                num_datums: 4,
            }],
            metrics: HashMap::new(),
        };
        let back = ForwardBackwardOutput::decode(out.encode_to_vec().as_slice()).unwrap();
        let rec = &back.loss_fn_outputs[0];
        let parts = rec.fields["logprobs"]
            .split(rec.num_datums, "logprobs")
            .unwrap();
        assert_eq!(parts.iter().map(Values::len).collect::<Vec<_>>(), lens);
        assert_eq!(parts[1].to_f32()[0], all[11]);
        assert_eq!(parts[3].to_f32(), all[34..].to_vec());
    }

    #[test]
    fn bad_offsets_and_ragged_bytes_are_errors() {
        let bt = BatchedTensor {
            data: encode_f32(&[1.0, 2.0]),
            offsets: encode_i64(&[0, 4, 12]),
            dtype: DType::Float32 as i32,
            trailing_shape: vec![],
        };
        assert!(matches!(
            bt.split(2, "x"),
            Err(ProtoError::BadOffsets { .. })
        ));
        assert!(matches!(
            bt.split(3, "x"),
            Err(ProtoError::BadOffsets { .. })
        ));
        assert!(matches!(
            decode_f32(&[0, 0, 0], "y"),
            Err(ProtoError::Ragged { width: 4, .. })
        ));
        let unspecified = BatchedTensor {
            dtype: DType::Unspecified as i32,
            offsets: encode_i64(&[0, 8]),
            ..bt.clone()
        };
        assert!(matches!(
            unspecified.split(1, "z"),
            Err(ProtoError::UnsupportedDType { .. })
        ));
    }

    #[test]
    fn int32_and_bf16_widen() {
        let bt = BatchedTensor {
            data: encode_i32(&[7, -1]),
            offsets: encode_i64(&[0, 8]),
            dtype: DType::Int32 as i32,
            trailing_shape: vec![],
        };
        assert_eq!(bt.split(1, "t").unwrap(), vec![Values::I64(vec![7, -1])]);
        // 1.5f32 = 0x3FC00000: its top half is 0x3FC0.
        assert_eq!(decode_bf16(&[0xc0, 0x3f], "b").unwrap(), vec![1.5]);
    }

    #[test]
    fn sample_response_round_trips() {
        let resp = SampleResponse {
            sequences: vec![
                SampledSequence {
                    stop_reason: StopReason::Length as i32,
                    tokens: encode_i32(&[3, 4]),
                    logprobs: Some(encode_f32(&[-0.5, -1.5])),
                },
                SampledSequence {
                    stop_reason: StopReason::Stop as i32,
                    tokens: encode_i32(&[2]),
                    logprobs: None,
                },
            ],
            prompt_logprobs: Some(encode_f32(&[f32::NAN, -2.0])),
            topk_prompt_logprobs: None,
            prompt_cache_hit_tokens: 0,
        };
        let bytes = resp.encode_to_vec();
        let back = SampleResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.sequences, resp.sequences);
        // proto3: the default enum value (STOP = 0) is not written at all.
        assert_eq!(back.sequences[1].stop_reason(), StopReason::Stop);
        let p = decode_f32(back.prompt_logprobs.as_deref().unwrap(), "p").unwrap();
        assert!(p[0].is_nan());
        assert_eq!(p[1], -2.0);
    }
}
