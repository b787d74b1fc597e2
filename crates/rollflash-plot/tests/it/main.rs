//! Charts render to valid PNGs with the bundled font, and bad input is an error.

use rollflash_plot::{line_chart, Chart, PlotError, Series};

fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let w = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    let h = u32::from_be_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
    (w, h)
}

#[test]
fn draws_two_series_with_legend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reward.png");
    let chart = Chart::new("reward vs step", "step", "reward")
        .with(Series::new(
            "async α=1",
            (0..50)
                .map(|i| (i as f64, (i as f64 / 50.0).sqrt()))
                .collect(),
        ))
        .with(Series::new(
            "sync",
            (0..50).map(|i| (i as f64, i as f64 / 60.0)).collect(),
        ));
    line_chart(&path, &chart).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(png_size(&bytes), (800, 500));
    // A blank white image compresses to almost nothing; lines, text and legend do not.
    assert!(
        bytes.len() > 5_000,
        "suspiciously small PNG: {} bytes",
        bytes.len()
    );
}

#[test]
fn log_x_skips_non_positive_and_non_finite_points() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scale.png");
    let mut chart = Chart::new("throughput vs GPUs", "GPUs", "samples/s").with(Series::new(
        "sim",
        vec![
            (0.0, 1.0),
            (8.0, 10.0),
            (64.0, f64::NAN),
            (64.0, 75.0),
            (512.0, 560.0),
        ],
    ));
    chart.log_x = true;
    line_chart(&path, &chart).unwrap();
    assert!(path.exists());
}

#[test]
fn empty_chart_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let chart = Chart::new("nothing", "x", "y").with(Series::new("s", vec![(f64::NAN, 1.0)]));
    match line_chart(&dir.path().join("x.png"), &chart) {
        Err(PlotError::Empty { title }) => assert_eq!(title, "nothing"),
        other => panic!("expected Empty, got {other:?}"),
    }
}

#[test]
#[ignore = "writes /tmp/rollflash-plot-demo.png for a look by eye"]
fn demo() {
    let chart = Chart::new("reward vs step", "step", "reward")
        .with(Series::new(
            "async α=1",
            (0..50)
                .map(|i| (i as f64, (i as f64 / 50.0).sqrt()))
                .collect(),
        ))
        .with(Series::new(
            "sync",
            (0..50).map(|i| (i as f64, i as f64 / 60.0)).collect(),
        ));
    line_chart(std::path::Path::new("/tmp/rollflash-plot-demo.png"), &chart).unwrap();
}
