//! Writing the simulator's tables: each as Markdown and CSV, its charts as PNGs, and all of
//! them in one `tables.md` (for `rollflash sim` and `rollflash sim validate`).

use std::path::{Path, PathBuf};

use rollflash_core::IoError;
use rollflash_plot::{line_chart, Chart, Series};
use rollflash_sim::Table;

/// A table or chart could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TablesError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("drawing {path}")]
    Plot {
        path: PathBuf,
        #[source]
        source: rollflash_plot::PlotError,
    },
}

/// Prints every table and writes `NAME.md`, `NAME.csv` and its charts (`PLOT.png`) under
/// `out`, and all tables in `tables.md`.
pub fn write(out: &Path, tables: &[Table]) -> Result<(), TablesError> {
    std::fs::create_dir_all(out).map_err(IoError::at("cannot create", out))?;
    let mut all_md = String::new();
    for t in tables {
        let md = t.to_markdown();
        println!("{md}");
        all_md.push_str(&md);
        all_md.push('\n');
        write_text(&out.join(format!("{}.md", t.name)), &md)?;
        write_text(&out.join(format!("{}.csv", t.name)), &t.to_csv())?;
        for p in &t.plots {
            let mut chart = Chart::new(&p.title, &p.x_label, &p.y_label);
            chart.log_x = p.log_x;
            for (name, pts) in &p.series {
                chart = chart.with(Series::new(name.clone(), pts.clone()));
            }
            let path = out.join(format!("{}.png", p.name));
            line_chart(&path, &chart).map_err(|source| TablesError::Plot {
                path: path.clone(),
                source,
            })?;
        }
    }
    write_text(&out.join("tables.md"), &all_md)
}

/// Writes `text` to `path`.
pub fn write_text(path: &Path, text: &str) -> Result<(), TablesError> {
    std::fs::write(path, text)
        .map_err(|source| TablesError::Io(IoError::new("cannot write", path.to_path_buf(), source)))
}
