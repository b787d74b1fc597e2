//! Charts render to valid PNGs with the bundled font, and bad input is an error.

use rollflash_plot::{
    ema, ema_window, gantt_chart, line_chart, Bar, Chart, Gantt, PlotError, Series, Style,
};

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
fn ema_starts_at_the_first_point_and_weighs_the_newest_by_its_window() {
    // Window 3: weight 2 / (3 + 1) = 0.5 on the newest point.
    let s = ema(&[(0.0, 0.0), (1.0, 1.0), (2.0, f64::NAN), (3.0, 1.0)], 3);
    assert_eq!(s, vec![(0.0, 0.0), (1.0, 0.5), (3.0, 0.75)]);
    assert_eq!(ema_window(5), None);
    assert_eq!(ema_window(50), Some(5));
    assert_eq!(ema_window(10_000), Some(25));
}

#[test]
fn a_smoothed_curve_is_a_faint_raw_line_under_its_named_ema() {
    let pts: Vec<(f64, f64)> = (0..40).map(|i| (i as f64, (i % 3) as f64)).collect();
    let chart = Chart::new("reward", "step", "")
        .integer_x()
        .with_smoothed("mean reward", pts.clone())
        .with(Series::new("held-out", vec![(0.0, 0.5), (40.0, 0.9)]).styled(Style::Points));
    assert_eq!(chart.series.len(), 3);
    assert_eq!(chart.series[0].style, Style::Faint);
    assert_eq!(chart.series[0].name, "");
    assert_eq!(chart.series[0].points, pts);
    assert_eq!(chart.series[1].name, "mean reward (EMA, window 4)");
    assert_eq!(chart.series[1].color, chart.series[0].color);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smoothed.png");
    line_chart(&path, &chart).unwrap();
    assert_eq!(png_size(&std::fs::read(&path).unwrap()), (800, 500));
    // Too few points to smooth: one plain line.
    let short = Chart::new("r", "step", "").with_smoothed("r", pts[..5].to_vec());
    assert_eq!(short.series.len(), 1);
    assert_eq!(short.series[0].style, Style::Line);
}

#[test]
fn a_timeline_draws_lanes_of_bars_and_is_as_tall_as_its_lanes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.png");
    let g = Gantt {
        title: "timeline".into(),
        x_label: "s".into(),
        lanes: vec![
            "engine-0".into(),
            "http://127.0.0.1:30000/a-long-name".into(),
            "trainer".into(),
        ],
        kinds: vec![("generate".into(), 0), ("train".into(), 1)],
        bars: vec![
            Bar {
                lane: 0,
                kind: 0,
                start: 0.0,
                end: 2.0,
            },
            Bar {
                lane: 1,
                kind: 0,
                start: 0.5,
                end: 2.5,
            },
            Bar {
                lane: 2,
                kind: 1,
                start: 2.0,
                end: 2.0,
            },
            // Out of range: ignored.
            Bar {
                lane: 7,
                kind: 1,
                start: 0.0,
                end: 9.0,
            },
        ],
    };
    gantt_chart(&path, &g).unwrap();
    let (w, h) = png_size(&std::fs::read(&path).unwrap());
    assert_eq!(w, 1000);
    assert!(h > 200, "{h}");
    let empty = Gantt { bars: vec![], ..g };
    assert!(matches!(
        gantt_chart(&path, &empty),
        Err(PlotError::Empty { .. })
    ));
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
