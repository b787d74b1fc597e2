//! KL estimators: values at hand-computed points, their gradients, the k3 clamp, and the
//! reward-penalty helper. Tolerance 1e-12 (f64).

use candle_core::{Device, Tensor, Var};
use rollflash_train::kl::{kl_penalty, kl_per_token, K3_CLAMP};
use rollflash_train::KlEstimator;

use crate::common::{assert_all_close, assert_close};

#[test]
fn estimates_follow_roll_direction() {
    // d = logπ − ref = 0.5.
    let (lp, r) = (-1.0, -1.5);
    assert_close(KlEstimator::K1.estimate(lp, r), 0.5, 1e-15, 0.0, "k1");
    assert_close(KlEstimator::K2.estimate(lp, r), 0.125, 1e-15, 0.0, "k2");
    assert_close(KlEstimator::Abs.estimate(r, lp), 0.5, 1e-15, 0.0, "abs");
    // k3 = exp(ref − logπ) − (ref − logπ) − 1 = e^{−0.5} + 0.5 − 1.
    let k3 = (-0.5f64).exp() + 0.5 - 1.0;
    assert_close(KlEstimator::K3.estimate(lp, r), k3, 1e-15, 0.0, "k3");
    assert!(
        KlEstimator::K3.estimate(r, lp) > 0.0,
        "k3 is never negative"
    );
    // ROLL clamps k3 at 10.
    assert_eq!(KlEstimator::K3.estimate(-20.0, 0.0), K3_CLAMP);
}

#[test]
fn tensor_gradients_are_the_analytic_ones() {
    let dev = Device::Cpu;
    let lp = [-1.0f64, -0.3, -2.0, -4.0, -1.0];
    let rf = [-1.5f64, -0.3, -1.0, 10.0, -1.0]; // token 3: k3 = e^14 − … clamped at 10
    let logp = Var::from_slice(&lp, 5, &dev).unwrap();
    let reference = Tensor::from_slice(&rf, 5, &dev).unwrap();
    let grad = |est: KlEstimator| {
        let kl = est.tensor(logp.as_tensor(), &reference).unwrap();
        let values: Vec<f64> = kl.to_vec1().unwrap();
        for t in 0..5 {
            assert_close(values[t], est.estimate(lp[t], rf[t]), 1e-12, 1e-12, "value");
        }
        let g = kl.sum_all().unwrap().backward().unwrap();
        g.get(logp.as_tensor()).unwrap().to_vec1::<f64>().unwrap()
    };
    let d: Vec<f64> = lp.iter().zip(&rf).map(|(l, r)| l - r).collect();
    assert_all_close(&grad(KlEstimator::K1), &[1.0; 5], 1e-12, 0.0, "k1");
    assert_all_close(&grad(KlEstimator::K2), &d, 1e-12, 0.0, "k2");
    let k3: Vec<f64> = d
        .iter()
        .enumerate()
        .map(|(t, d)| if t == 3 { 0.0 } else { 1.0 - (-d).exp() })
        .collect();
    assert_all_close(
        &grad(KlEstimator::K3),
        &k3,
        1e-12,
        0.0,
        "k3 (clamped token: 0)",
    );
    let abs: Vec<f64> = d
        .iter()
        .map(|&d| if d == 0.0 { 0.0 } else { d.signum() })
        .collect();
    assert_all_close(
        &grad(KlEstimator::Abs),
        &abs,
        1e-12,
        0.0,
        "abs (0 at d = 0)",
    );
}

#[test]
fn penalty_is_coefficient_times_estimate_on_valid_tokens() {
    let lp = [-1.0, -2.0, -0.5];
    let rf = [-1.2, -1.0, f64::NAN];
    let mask = [true, true, false];
    let kl = kl_per_token(KlEstimator::K1, &lp, &rf, &mask).unwrap();
    assert_all_close(&kl, &[0.2, -1.0, 0.0], 1e-12, 0.0, "k1");
    let pen = kl_penalty(KlEstimator::K1, 0.1, &lp, &rf, &mask).unwrap();
    assert_all_close(&pen, &[0.02, -0.1, 0.0], 1e-12, 0.0, "penalty");
    let err = kl_per_token(KlEstimator::K1, &lp, &rf[..2], &mask).unwrap_err();
    assert!(err.to_string().contains("ref_logp"), "{err}");
}
