//! The Rust forward pass against an independent reference implementation.
//!
//! Fixtures: `tests/fixtures/ref_{llama,qwen2,qwen3}/` each hold a tiny random checkpoint in real
//! Hugging Face layout — `config.json` with the usual HF keys and a float32 `model.safetensors`
//! with HF tensor names (vocab 64, hidden 32, intermediate 48, 2 layers, 4 query heads sharing
//! 2 key/value heads of dim 8; Qwen2 with q/k/v biases, Qwen3 with per-head q/k RMSNorm and tied
//! embeddings; matrices ~ N(0, 0.2), norm weights ~ 1 + N(0, 0.1), so activations are O(1)) —
//! and `reference.json`: a 12-token sequence and its logits `[12, 64]`. The logits come from
//! `scripts/reference_forward.py`, a float64 NumPy implementation written from the published
//! `transformers` modeling code (modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py),
//! run on the float32 weights upcast to float64. That script's `self-check` mode checks the
//! reference against a second, token-by-token implementation, checks causality, and shows that
//! common mistakes (interleaved rotary, wrong GQA head mapping, missing biases or q/k norm,
//! q/k norm after rotary, wrong attention scale, ...) move these logits by more than 0.1.
//! Regenerate with
//! `scripts/setup_python.sh && .venv/bin/python scripts/reference_forward.py generate-fixtures`.
//!
//! Tolerances, as the maximum absolute error over all logits (which are O(1)):
//! - `DType::F32`: 1e-4. A float32 NumPy run of the same forward lands within ~2e-6.
//! - `DType::F64`: 1e-9. Only summation order may differ; note that this requires the rotary
//!   cos/sin tables in float64 (transformers builds them in float32, which alone costs ~1e-7).

use std::error::Error;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rollflash_model::config::Arch;
use rollflash_model::hf::load_dir;

type TestResult = Result<(), Box<dyn Error>>;

const F32_TOL: f64 = 1e-4;
const F64_TOL: f64 = 1e-9;

/// The families with a reference fixture, with what their `config.json` must load as.
const FAMILIES: [(&str, Arch); 3] = [
    ("llama", Arch::Llama),
    ("qwen2", Arch::Qwen2),
    ("qwen3", Arch::Qwen3),
];

/// The part of `reference.json` the test reads.
#[derive(Debug, serde::Deserialize)]
struct Reference {
    tokens: Vec<u32>,
    logits_shape: [usize; 2],
    /// `logits[t][v]`: logit of token `v` at position `t`.
    logits: Vec<Vec<f64>>,
}

fn fixture_dir(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join(format!("ref_{family}"))
}

fn read_reference(dir: &Path) -> Result<Reference, Box<dyn Error>> {
    let path = dir.join("reference.json");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let reference: Reference =
        serde_json::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))?;
    let [t, v] = reference.logits_shape;
    if reference.tokens.len() != t
        || reference.logits.len() != t
        || reference.logits.iter().any(|row| row.len() != v)
    {
        return Err(format!("{}: logits do not have shape [{t}, {v}]", path.display()).into());
    }
    Ok(reference)
}

/// Max |got - want| over all entries, with its position; NaN counts as infinitely wrong.
fn max_abs_error(got: &[Vec<f64>], want: &[Vec<f64>]) -> (f64, usize, usize) {
    let mut worst = (0.0_f64, 0, 0);
    for (t, (g_row, w_row)) in got.iter().zip(want).enumerate() {
        for (v, (g, w)) in g_row.iter().zip(w_row).enumerate() {
            let err = (g - w).abs();
            let err = if err.is_nan() { f64::INFINITY } else { err };
            if err > worst.0 {
                worst = (err, t, v);
            }
        }
    }
    worst
}

/// Loads `ref_{family}` in `dtype`, runs `tokens[..len]` from position 0, and compares the
/// logits with the first `len` reference rows (valid for any prefix, the model being causal).
fn check(family: &str, arch: Arch, dtype: DType, len: Option<usize>, tol: f64) -> TestResult {
    let dir = fixture_dir(family);
    let reference = read_reference(&dir)?;
    let loaded = load_dir(&dir, dtype, &Device::Cpu)?;

    let config = &loaded.config;
    assert_eq!(config.arch, arch, "{family}: architecture");
    assert_eq!(
        config.vocab_size, reference.logits_shape[1],
        "{family}: vocab_size"
    );
    assert_eq!(config.num_hidden_layers, 2, "{family}: num_hidden_layers");
    assert_eq!(
        (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim
        ),
        (4, 2, 8),
        "{family}: heads"
    );
    assert_eq!(
        config.tie_word_embeddings,
        arch == Arch::Qwen3,
        "{family}: tie_word_embeddings"
    );
    assert_eq!(
        config.attention_bias,
        arch == Arch::Qwen2,
        "{family}: attention_bias"
    );
    assert_eq!(config.qk_norm, arch == Arch::Qwen3, "{family}: qk_norm");

    let len = len.unwrap_or(reference.tokens.len());
    let tokens = &reference.tokens[..len];
    let want = &reference.logits[..len];
    let logits = loaded.model.forward_logits(tokens)?;
    assert_eq!(
        logits.dims(),
        &[len, reference.logits_shape[1]],
        "{family} {dtype:?}: logits shape"
    );
    let got = logits.to_dtype(DType::F64)?.to_vec2::<f64>()?;

    let (err, t, v) = max_abs_error(&got, want);
    assert!(
        err <= tol,
        "{family} {dtype:?} ({len} tokens): max abs logit error {err:.3e} > {tol:.0e} \
         at position {t}, token {v}: got {}, reference {}",
        got[t][v],
        want[t][v],
    );
    Ok(())
}

fn check_all(dtype: DType, len: Option<usize>, tol: f64) -> TestResult {
    for (family, arch) in FAMILIES {
        check(family, arch, dtype, len, tol)?;
    }
    Ok(())
}

#[test]
fn llama_logits_match_reference_f32() -> TestResult {
    check("llama", Arch::Llama, DType::F32, None, F32_TOL)
}

#[test]
fn llama_logits_match_reference_f64() -> TestResult {
    check("llama", Arch::Llama, DType::F64, None, F64_TOL)
}

#[test]
fn qwen2_logits_match_reference_f32() -> TestResult {
    check("qwen2", Arch::Qwen2, DType::F32, None, F32_TOL)
}

#[test]
fn qwen2_logits_match_reference_f64() -> TestResult {
    check("qwen2", Arch::Qwen2, DType::F64, None, F64_TOL)
}

#[test]
fn qwen3_logits_match_reference_f32() -> TestResult {
    check("qwen3", Arch::Qwen3, DType::F32, None, F32_TOL)
}

#[test]
fn qwen3_logits_match_reference_f64() -> TestResult {
    check("qwen3", Arch::Qwen3, DType::F64, None, F64_TOL)
}

/// A prefix of the sequence must give exactly the reference's first rows (causal masking, and
/// rotary positions that depend on the position only, not on the sequence length).
#[test]
fn prefixes_match_reference_rows_f64() -> TestResult {
    for len in [1, 5] {
        check_all(DType::F64, Some(len), F64_TOL)?;
    }
    Ok(())
}
