//! The standard errors the evaluations report, against Python's `statistics` module.

use rollflash_run::eval::{binomial_se, mean_se};

#[test]
fn binomial_standard_error_of_a_success_rate() {
    // math.sqrt(0.15 * 0.85 / 200) = 0.025248762345905194
    assert!((binomial_se(0.15, 200) - 0.025_248_762_345_905_194).abs() < 1e-15);
    assert_eq!(binomial_se(0.0, 200), 0.0);
    assert_eq!(binomial_se(1.0, 200), 0.0);
    assert_eq!(binomial_se(0.5, 0), 0.0);
}

#[test]
fn standard_error_of_per_task_pass_rates_uses_the_sample_deviation() {
    // statistics.stdev([1, 0, 0.5, 0.5, 0.25]) / math.sqrt(5) = 0.16583123951776998
    let se = mean_se(&[1.0, 0.0, 0.5, 0.5, 0.25]);
    assert!((se - 0.165_831_239_517_769_98).abs() < 1e-15, "{se}");
    // One task, or none, has no spread to estimate.
    assert_eq!(mean_se(&[0.5]), 0.0);
    assert_eq!(mean_se(&[]), 0.0);
}
