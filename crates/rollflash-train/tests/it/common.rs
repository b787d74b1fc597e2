//! Shared helpers: one `run` that evaluates the policy loss on plain vectors and returns the
//! loss, its gradient w.r.t. `logp` and the metrics, so every test goes through one path.

use candle_core::{DType, Device, Tensor, Var};
use rollflash_train::{policy_loss, LossConfig, LossMetrics, PolicyLossInputs, Result};

/// A packed batch as plain vectors.
#[derive(Debug, Clone)]
pub struct Data {
    pub logp: Vec<f64>,
    pub old_logp: Vec<f64>,
    pub behav_logp: Vec<f64>,
    pub adv: Vec<f64>,
    pub mask: Vec<f64>,
    pub seq_offsets: Vec<usize>,
    pub ref_logp: Option<Vec<f64>>,
    pub entropy: Option<Vec<f64>>,
    pub seq_scores: Option<Vec<f64>>,
}

impl Data {
    /// One sequence per entry of `lengths`, everything valid, π_θ = π_old = π_behav at
    /// log-prob −1, advantages `adv`.
    pub fn simple(lengths: &[usize], adv: &[f64]) -> Self {
        let n: usize = lengths.iter().sum();
        assert_eq!(adv.len(), n);
        let mut offsets = Vec::new();
        let mut at = 0;
        for &l in lengths {
            offsets.push(at);
            at += l;
        }
        Data {
            logp: vec![-1.0; n],
            old_logp: vec![-1.0; n],
            behav_logp: vec![-1.0; n],
            adv: adv.to_vec(),
            mask: vec![1.0; n],
            seq_offsets: offsets,
            ref_logp: None,
            entropy: None,
            seq_scores: None,
        }
    }
}

/// What one evaluation gives back.
#[derive(Debug, Clone)]
pub struct Run {
    pub loss: f64,
    pub grad: Vec<f64>,
    pub metrics: LossMetrics,
}

/// Evaluates `cfg` on `data` in `dtype` on the CPU: loss value, d loss / d logp, metrics.
pub fn run(data: &Data, cfg: &LossConfig, dtype: DType) -> Result<Run> {
    let dev = Device::Cpu;
    let n = data.logp.len();
    let t = |v: &[f64]| -> Result<Tensor> {
        Ok(Tensor::from_slice(v, v.len(), &dev)?.to_dtype(dtype)?)
    };
    let logp = Var::from_tensor(&t(&data.logp)?)?;
    let old = t(&data.old_logp)?;
    let behav = t(&data.behav_logp)?;
    let adv = t(&data.adv)?;
    let mask = t(&data.mask)?;
    let ref_logp = data.ref_logp.as_deref().map(t).transpose()?;
    let entropy = data.entropy.as_deref().map(t).transpose()?;
    let mut inputs = PolicyLossInputs::new(
        logp.as_tensor(),
        &old,
        &behav,
        &adv,
        &mask,
        &data.seq_offsets,
    );
    inputs.ref_logp = ref_logp.as_ref();
    inputs.entropy = entropy.as_ref();
    inputs.seq_scores = data.seq_scores.as_deref();
    let out = policy_loss(&inputs, cfg)?;
    assert_eq!(out.loss.rank(), 0, "loss must be a scalar");
    assert_eq!(out.loss.dtype(), dtype, "loss keeps logp's dtype");
    let grads = out.loss.backward()?;
    let grad = match grads.get(logp.as_tensor()) {
        Some(g) => g.to_dtype(DType::F64)?.to_vec1::<f64>()?,
        None => vec![0.0; n],
    };
    Ok(Run {
        loss: out.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?,
        grad,
        metrics: out.metrics,
    })
}

/// `run` in f64.
pub fn run64(data: &Data, cfg: &LossConfig) -> Run {
    run(data, cfg, DType::F64).unwrap()
}

/// `|got − want| <= atol + rtol·|want|`, with a message naming `what`.
#[track_caller]
pub fn assert_close(got: f64, want: f64, atol: f64, rtol: f64, what: &str) {
    assert!(
        (got - want).abs() <= atol + rtol * want.abs(),
        "{what}: got {got}, want {want} (diff {:.3e}, atol {atol:e}, rtol {rtol:e})",
        (got - want).abs()
    );
}

/// Element-wise [`assert_close`].
#[track_caller]
pub fn assert_all_close(got: &[f64], want: &[f64], atol: f64, rtol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_close(*g, *w, atol, rtol, &format!("{what}[{i}]"));
    }
}

/// A config for `variant` with everything else default.
pub fn cfg_with(f: impl FnOnce(&mut LossConfig)) -> LossConfig {
    let mut c = LossConfig::default();
    f(&mut c);
    c
}
