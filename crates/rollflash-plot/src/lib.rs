//! PNG line charts: what `rollflash train` reports and `rollflash sim`/`bench` draw.
//!
//! One small entry point, [`line_chart`], over plain data ([`Chart`], [`Series`]). The font
//! is bundled (DejaVu Sans, Bitstream Vera licence in `fonts/`) so charts render the same on
//! a machine without system fonts.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;

const FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("chart {title:?}: {message}")]
    Draw { title: String, message: String },
    #[error("chart {title:?}: no finite points to draw")]
    Empty { title: String },
}

/// One named line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// `(x, y)` points in drawing order; non-finite points are skipped.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// A series named `name`.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
        }
    }
}

/// A line chart: title, axis labels and its series.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Log-scale x axis (for resource sweeps such as 8 → 512 GPUs).
    pub log_x: bool,
    /// Fixed y range; `None` fits the data (always including 0 when all values are ≥ 0).
    pub y_range: Option<(f64, f64)>,
}

impl Chart {
    /// A chart with linear axes fitted to the data.
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
    ) -> Self {
        Chart {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series: Vec::new(),
            log_x: false,
            y_range: None,
        }
    }

    /// Adds a series.
    pub fn with(mut self, series: Series) -> Self {
        self.series.push(series);
        self
    }
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Fails only if the bundled bytes are not a font, which the tests would catch.
        let _ = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT);
    });
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn bounds(chart: &Chart) -> Option<((f64, f64), (f64, f64))> {
    let pts = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|(x, y)| x.is_finite() && y.is_finite() && (!chart.log_x || *x > 0.0));
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    let mut any = false;
    for &(x, y) in pts {
        any = true;
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !any {
        return None;
    }
    if let Some(r) = chart.y_range {
        (y0, y1) = r;
    } else {
        if y0 >= 0.0 {
            y0 = 0.0;
        }
        let pad = ((y1 - y0) * 0.05).max(1e-9);
        y1 += pad;
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    Some(((x0, x1), (y0, y1)))
}

/// Draws `chart` as an 800×500 PNG at `path`.
pub fn line_chart(path: &Path, chart: &Chart) -> Result<(), PlotError> {
    register_font();
    let ((x0, x1), (y0, y1)) = bounds(chart).ok_or_else(|| PlotError::Empty {
        title: chart.title.clone(),
    })?;
    let fail = |e: &dyn std::fmt::Display| PlotError::Draw {
        title: chart.title.clone(),
        message: e.to_string(),
    };
    let root = BitMapBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(&chart.title, (FAMILY, 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60);
    // The two axis kinds are different types in plotters, hence the duplicated drawing.
    macro_rules! draw {
        ($ctx:expr) => {{
            let mut ctx = $ctx;
            ctx.configure_mesh()
                .x_desc(chart.x_label.as_str())
                .y_desc(chart.y_label.as_str())
                .label_style((FAMILY, 13))
                .draw()
                .map_err(|e| fail(&e))?;
            for (i, s) in chart.series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let pts: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && y.is_finite() && (!chart.log_x || *x > 0.0))
                    .collect();
                ctx.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| fail(&e))?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                if pts.len() <= 40 {
                    ctx.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                        .map_err(|e| fail(&e))?;
                }
            }
            if chart.series.len() > 1 {
                ctx.configure_series_labels()
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .label_font((FAMILY, 13))
                    .draw()
                    .map_err(|e| fail(&e))?;
            }
        }};
    }
    if chart.log_x {
        draw!(builder
            .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
            .map_err(|e| fail(&e))?);
    } else {
        draw!(builder
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| fail(&e))?);
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}
