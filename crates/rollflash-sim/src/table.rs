//! Results as plain data: a [`Table`] renders itself as Markdown or CSV text, a [`Plot`]
//! describes a line chart. Writing files is the caller's business.

/// One cell of a table.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Text(String),
    /// A number shown with `digits` decimals.
    Num {
        value: f64,
        digits: usize,
    },
}

impl Cell {
    /// A text cell.
    pub fn text(s: impl Into<String>) -> Self {
        Cell::Text(s.into())
    }

    /// A number with `digits` decimals.
    pub fn num(value: f64, digits: usize) -> Self {
        Cell::Num { value, digits }
    }

    /// The number, if it is one.
    pub fn value(&self) -> Option<f64> {
        match self {
            Cell::Num { value, .. } => Some(*value),
            Cell::Text(_) => None,
        }
    }
}

impl std::fmt::Display for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cell::Text(s) => f.write_str(s),
            Cell::Num { value, digits } => write!(f, "{value:.digits$}"),
        }
    }
}

/// A line chart's data (drawn by `rollflash sim` with `rollflash-plot`).
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    /// File stem of the PNG.
    pub name: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    /// Named lines of `(x, y)` points.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

/// A titled table with a note on how to read it.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// File stem for the CSV and Markdown files.
    pub name: String,
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
    /// What the table shows and what was held fixed.
    pub note: String,
    pub plots: Vec<Plot>,
}

impl Table {
    /// An empty table.
    pub fn new(name: &str, title: &str, columns: &[&str]) -> Self {
        Table {
            name: name.to_string(),
            title: title.to_string(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
            note: String::new(),
            plots: Vec::new(),
        }
    }

    /// GitHub-flavoured Markdown: the title, the table, the note.
    pub fn to_markdown(&self) -> String {
        let mut s = format!("### {}\n\n", self.title);
        s.push_str(&format!("| {} |\n", self.columns.join(" | ")));
        s.push_str(&format!(
            "|{}\n",
            self.columns.iter().map(|_| " --- |").collect::<String>()
        ));
        for r in &self.rows {
            let cells: Vec<String> = r.iter().map(ToString::to_string).collect();
            s.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        if !self.note.is_empty() {
            s.push_str(&format!("\n{}\n", self.note));
        }
        s
    }

    /// CSV (RFC 4180 quoting where needed), header first.
    pub fn to_csv(&self) -> String {
        let quote = |c: &str| {
            if c.contains([',', '"', '\n']) {
                format!("\"{}\"", c.replace('"', "\"\""))
            } else {
                c.to_string()
            }
        };
        let mut s = self
            .columns
            .iter()
            .map(|c| quote(c))
            .collect::<Vec<_>>()
            .join(",");
        s.push('\n');
        for r in &self.rows {
            let cells: Vec<String> = r
                .iter()
                .map(|c| match c {
                    Cell::Num { value, .. } => format!("{value}"),
                    Cell::Text(t) => quote(t),
                })
                .collect();
            s.push_str(&cells.join(","));
            s.push('\n');
        }
        s
    }
}
