//! PNG charts: what `rollflash train` reports and `rollflash sim`/`bench` draw.
//!
//! Two entry points over plain data: [`line_chart`] ([`Chart`], [`Series`]) and
//! [`gantt_chart`] ([`Gantt`], [`Bar`]: the run timeline). Charts read like published ones:
//! a noisy per-step curve can be drawn faint under its EMA ([`Chart::with_smoothed`], the
//! window stated in the legend), step axes get integer ticks ([`Chart::integer_x`]), marked
//! points stand out ([`Style::Points`]), and legends sit in a strip under the plot, never
//! over the data. The font is bundled (DejaVu Sans, Bitstream Vera licence in `fonts/`) so
//! charts render the same on a machine without system fonts.

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

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Style {
    /// A line (with a dot per point when there are few).
    #[default]
    Line,
    /// A thin, light line: the raw curve under its smoothed one.
    Faint,
    /// Large marked points, no line: a few measurements (held-out evaluations).
    Points,
}

/// One named line. A series with an empty name is left out of the legend.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// `(x, y)` points in drawing order; non-finite points are skipped.
    pub points: Vec<(f64, f64)>,
    pub style: Style,
    /// Index into the palette; `None` takes the next colour in order. A raw curve and its
    /// EMA share one.
    pub color: Option<usize>,
}

impl Series {
    /// A line named `name`.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
            style: Style::Line,
            color: None,
        }
    }

    /// The same series drawn as `style`.
    pub fn styled(mut self, style: Style) -> Self {
        self.style = style;
        self
    }

    /// The same series in palette colour `i`.
    pub fn colored(mut self, i: usize) -> Self {
        self.color = Some(i);
        self
    }
}

/// The exponential moving average of `points`' y values with weight `2 / (window + 1)` on
/// the newest point, started at the first point (no warm-up bias to correct). Non-finite
/// points are skipped.
pub fn ema(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    let a = 2.0 / (window.max(1) as f64 + 1.0);
    let mut s: Option<f64> = None;
    points
        .iter()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .map(|&(x, y)| {
            let v = s.map_or(y, |prev| a * y + (1.0 - a) * prev);
            s = Some(v);
            (x, v)
        })
        .collect()
}

/// The EMA window for a curve of `n` points: a tenth of the run, between 3 and 25 points,
/// so a short run's curve is still close to its raw points and a long run's noise is
/// averaged out. `None` below 8 points, where smoothing hides more than it shows.
pub fn ema_window(n: usize) -> Option<usize> {
    (n >= 8).then(|| (n / 10).clamp(3, 25))
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
    /// The x values are counts (steps): ticks only at integers.
    pub integer_x: bool,
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
            integer_x: false,
        }
    }

    /// Adds a series.
    pub fn with(mut self, series: Series) -> Self {
        self.series.push(series);
        self
    }

    /// Adds `points` as a noisy per-step curve: with enough points ([`ema_window`]), the raw
    /// curve faint and its EMA over it in the same colour, named `name (EMA, window W)`;
    /// otherwise a plain line named `name`.
    pub fn with_smoothed(mut self, name: &str, points: Vec<(f64, f64)>) -> Self {
        let color = self.series.iter().filter(|s| !s.name.is_empty()).count();
        match ema_window(points.len()) {
            Some(w) => {
                let smooth = ema(&points, w);
                self.series
                    .push(Series::new("", points).styled(Style::Faint).colored(color));
                self.series
                    .push(Series::new(format!("{name} (EMA, window {w})"), smooth).colored(color));
            }
            None => self.series.push(Series::new(name, points).colored(color)),
        }
        self
    }

    /// Ticks only at integer x values.
    pub fn integer_x(mut self) -> Self {
        self.integer_x = true;
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
    // Marked points sit at the ends of a run (evaluations before and after): room for
    // their markers inside the plot.
    if !chart.log_x && chart.series.iter().any(|s| s.style == Style::Points) {
        let pad = (x1 - x0) * 0.02;
        (x0, x1) = (x0 - pad, x1 + pad);
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    Some(((x0, x1), (y0, y1)))
}

/// How many x labels to ask plotters for. Its ticks are "nice" steps (1, 2, 5 × 10^k)
/// with at most this many labels; for integer ticks, never more than one per unit, so the
/// step it picks is at least 1 and every tick is an integer.
fn x_label_count(chart: &Chart, x0: f64, x1: f64) -> usize {
    if chart.integer_x {
        ((x1 - x0).floor() as usize + 1).clamp(2, 10)
    } else {
        10
    }
}

/// The label of a tick: integers only on an integer axis (a fractional tick, which the
/// label count should prevent, gets none rather than a misleading rounded one).
fn x_label(chart: &Chart, x: f64) -> String {
    if chart.integer_x {
        if x.fract() == 0.0 {
            format!("{x:.0}")
        } else {
            String::new()
        }
    } else {
        // plotters' default formatting of f64 ticks.
        format!("{x}")
    }
}

/// The palette colour of each series of `chart`: its own, or, for one without, the index of
/// its entry in the legend (the named series before it), as [`Chart::with_smoothed`]
/// assigns them.
fn colors(chart: &Chart) -> Vec<RGBColor> {
    let mut named = 0;
    chart
        .series
        .iter()
        .map(|s| {
            let i = s.color.unwrap_or(named);
            if !s.name.is_empty() {
                named += 1;
            }
            COLORS[i % COLORS.len()]
        })
        .collect()
}

/// One legend entry: its name, colour and how its sample is drawn.
struct LegendEntry {
    name: String,
    color: RGBColor,
    style: Style,
}

const LEGEND_ROW: u32 = 22;

/// Lays `entries` out left to right in rows of at most `width` pixels; the rows' entries
/// with their x offsets.
fn legend_rows(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    entries: &[LegendEntry],
    width: u32,
) -> Vec<Vec<(u32, usize)>> {
    let font: TextStyle = (FAMILY, 13).into();
    let mut rows: Vec<Vec<(u32, usize)>> = vec![Vec::new()];
    let mut x = 0;
    for (i, e) in entries.iter().enumerate() {
        let text_w = area
            .estimate_text_size(&e.name, &font)
            .map_or(7 * e.name.len() as u32, |(w, _)| w);
        let w = 26 + text_w + 18;
        if x > 0 && x + w > width {
            rows.push(Vec::new());
            x = 0;
        }
        if let Some(row) = rows.last_mut() {
            row.push((x, i));
        }
        x += w;
    }
    rows
}

/// Draws the legend strip: each entry's sample (a line, a faint line or a marker) and name.
fn draw_legend(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    entries: &[LegendEntry],
    rows: &[Vec<(u32, usize)>],
    left: u32,
) -> Result<(), String> {
    for (r, row) in rows.iter().enumerate() {
        let y = (r as u32 * LEGEND_ROW + LEGEND_ROW / 2) as i32;
        for &(x, i) in row {
            let e = &entries[i];
            let x = (left + x) as i32;
            match e.style {
                Style::Points => area
                    .draw(&Circle::new((x + 9, y), 5, e.color.filled()))
                    .map_err(|e| e.to_string())?,
                Style::Line | Style::Faint => area
                    .draw(&PathElement::new(
                        vec![(x, y), (x + 18, y)],
                        e.color.stroke_width(2),
                    ))
                    .map_err(|e| e.to_string())?,
            }
            area.draw(&Text::new(
                e.name.clone(),
                (x + 24, y - 8),
                (FAMILY, 13).into_font(),
            ))
            .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Draws `chart` as an 800×500 PNG at `path`. With more than one named series, the legend
/// takes a strip under the plot.
pub fn line_chart(path: &Path, chart: &Chart) -> Result<(), PlotError> {
    register_font();
    let ((x0, x1), (y0, y1)) = bounds(chart).ok_or_else(|| PlotError::Empty {
        title: chart.title.clone(),
    })?;
    let fail = |e: &dyn std::fmt::Display| PlotError::Draw {
        title: chart.title.clone(),
        message: e.to_string(),
    };
    let (width, height) = (800u32, 500u32);
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let palette = colors(chart);
    let entries: Vec<LegendEntry> = chart
        .series
        .iter()
        .zip(&palette)
        .filter(|(s, _)| !s.name.is_empty())
        .map(|(s, &color)| LegendEntry {
            name: s.name.clone(),
            color,
            style: s.style,
        })
        .collect();
    // A smoothed curve always says its window, even alone.
    let smoothed = chart.series.iter().any(|s| s.style == Style::Faint);
    let (plot_area, legend) = if entries.len() > 1 || (smoothed && !entries.is_empty()) {
        let rows = legend_rows(&root, &entries, width - 100);
        let h = rows.len() as u32 * LEGEND_ROW + 8;
        let (top, bottom) = root.split_vertically(height - h);
        (top, Some((bottom, rows)))
    } else {
        (root.clone(), None)
    };
    let mut builder = ChartBuilder::on(&plot_area);
    builder
        .caption(&chart.title, (FAMILY, 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60);
    let n_x_labels = x_label_count(chart, x0, x1);
    // The two axis kinds are different types in plotters, hence the duplicated drawing.
    macro_rules! draw {
        ($ctx:expr) => {{
            let mut ctx = $ctx;
            ctx.configure_mesh()
                .x_desc(chart.x_label.as_str())
                .y_desc(chart.y_label.as_str())
                .x_labels(n_x_labels)
                .x_label_formatter(&|x| x_label(chart, *x))
                .label_style((FAMILY, 13))
                .draw()
                .map_err(|e| fail(&e))?;
            for (s, &color) in chart.series.iter().zip(&palette) {
                let pts: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && y.is_finite() && (!chart.log_x || *x > 0.0))
                    .collect();
                match s.style {
                    Style::Line => {
                        ctx.draw_series(LineSeries::new(
                            pts.iter().copied(),
                            color.stroke_width(2),
                        ))
                        .map_err(|e| fail(&e))?;
                        if pts.len() <= 40 {
                            ctx.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                                .map_err(|e| fail(&e))?;
                        }
                    }
                    Style::Faint => {
                        ctx.draw_series(LineSeries::new(
                            pts.iter().copied(),
                            color.mix(0.3).stroke_width(1),
                        ))
                        .map_err(|e| fail(&e))?;
                    }
                    Style::Points => {
                        ctx.draw_series(pts.iter().map(|&p| Circle::new(p, 6, color.filled())))
                            .map_err(|e| fail(&e))?;
                        ctx.draw_series(
                            pts.iter()
                                .map(|&p| Circle::new(p, 6, BLACK.stroke_width(1))),
                        )
                        .map_err(|e| fail(&e))?;
                    }
                }
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
    if let Some((area, rows)) = legend {
        draw_legend(&area, &entries, &rows, 72).map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// One bar of a [`Gantt`]: on lane `lane`, of kind `kind`, from `start` to `end` (x units).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bar {
    pub lane: usize,
    pub kind: usize,
    pub start: f64,
    pub end: f64,
}

/// A timeline: named lanes (top to bottom), kinds of bar (the legend: a name and a palette
/// colour index each), and the bars, drawn in order (a later bar over an earlier one).
#[derive(Debug, Clone, PartialEq)]
pub struct Gantt {
    pub title: String,
    pub x_label: String,
    pub lanes: Vec<String>,
    pub kinds: Vec<(String, usize)>,
    pub bars: Vec<Bar>,
}

/// The longest lane name drawn; longer ones (server URLs) are cut with an ellipsis.
const LANE_NAME_MAX: usize = 24;

/// Draws `gantt` as a PNG at `path`, 1000 pixels wide and as tall as its lanes need: one
/// row per lane, bars of each kind in the kind's colour (a bar shorter than a pixel is
/// still drawn one pixel wide), the kinds' legend in a strip under the plot.
pub fn gantt_chart(path: &Path, gantt: &Gantt) -> Result<(), PlotError> {
    register_font();
    let fail = |e: &dyn std::fmt::Display| PlotError::Draw {
        title: gantt.title.clone(),
        message: e.to_string(),
    };
    let bars: Vec<&Bar> = gantt
        .bars
        .iter()
        .filter(|b| b.start.is_finite() && b.end.is_finite() && b.lane < gantt.lanes.len())
        .collect();
    if bars.is_empty() {
        return Err(PlotError::Empty {
            title: gantt.title.clone(),
        });
    }
    let x0 = bars.iter().map(|b| b.start).fold(f64::MAX, f64::min);
    let mut x1 = bars.iter().map(|b| b.end).fold(f64::MIN, f64::max);
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let n = gantt.lanes.len();
    let lanes: Vec<String> = gantt
        .lanes
        .iter()
        .map(|l| {
            if l.chars().count() > LANE_NAME_MAX {
                let cut: String = l.chars().take(LANE_NAME_MAX - 1).collect();
                format!("{cut}…")
            } else {
                l.clone()
            }
        })
        .collect();
    let width = 1000u32;
    let legend_h = LEGEND_ROW + 8;
    let height = 110 + 36 * n as u32 + legend_h;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let (plot_area, legend_area) = root.split_vertically(height - legend_h);
    let label_w = lanes.iter().map(|l| l.chars().count()).max().unwrap_or(4) as u32 * 8 + 16;
    let mut ctx = ChartBuilder::on(&plot_area)
        .caption(&gantt.title, (FAMILY, 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(label_w)
        // Lane i is centred on y = n - 1 - i, so the first lane is on top.
        .build_cartesian_2d(x0..x1, -0.5..(n as f64 - 0.5))
        .map_err(|e| fail(&e))?;
    let lane_of = |y: f64| -> String {
        if y.fract() != 0.0 || y < 0.0 {
            return String::new();
        }
        let i = n.checked_sub(1 + y as usize);
        i.and_then(|i| lanes.get(i)).cloned().unwrap_or_default()
    };
    ctx.configure_mesh()
        .x_desc(gantt.x_label.as_str())
        .y_labels(n.max(2))
        .y_label_formatter(&|y| lane_of(*y))
        .disable_y_mesh()
        .label_style((FAMILY, 13))
        .draw()
        .map_err(|e| fail(&e))?;
    // One pixel of x, so an instant (a fast weight load) is still visible.
    let px = (x1 - x0) / f64::from(width);
    let kind_color = |k: usize| {
        let i = gantt.kinds.get(k).map_or(k, |(_, c)| *c);
        COLORS[i % COLORS.len()]
    };
    ctx.draw_series(bars.iter().map(|b| {
        let y = (n - 1 - b.lane) as f64;
        let end = b.end.max(b.start + px);
        Rectangle::new(
            [(b.start, y - 0.35), (end, y + 0.35)],
            kind_color(b.kind).mix(0.85).filled(),
        )
    }))
    .map_err(|e| fail(&e))?;
    let entries: Vec<LegendEntry> = gantt
        .kinds
        .iter()
        .enumerate()
        .map(|(k, (name, _))| LegendEntry {
            name: name.clone(),
            color: kind_color(k),
            style: Style::Line,
        })
        .collect();
    let rows = legend_rows(&legend_area, &entries, width - label_w - 40);
    draw_legend(&legend_area, &entries, &rows, label_w + 12).map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}
