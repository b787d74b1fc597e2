//! A case set for judging graders: responses with a reference answer and a careful human
//! verdict (`scripts/verifier_cases.jsonl`), and how often a grader agrees with the verdicts.
//!
//! `rollflash verify --cases FILE` prints [`MathVerifier`]'s verdict on each case, which
//! `scripts/verifier_agreement.py` sets beside HF math-verify's; the `verify` tests assert
//! the agreement rate without Python.

use rollflash_core::IoError;
use serde::{Deserialize, Serialize};

use super::{MathVerifier, Verifier};

/// One case: the reference (`gold`, as a dataset row would hold it), the model's whole
/// response, and whether a careful human grader marks it correct.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Case {
    /// What the case probes (`reorder`, `set`, `units`, …).
    pub kind: String,
    pub gold: String,
    pub answer: String,
    pub human: bool,
}

/// Why a case file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CasesError {
    /// The file could not be read (the message names it).
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("{path}: line {line}")]
    Json {
        path: String,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// Reads a JSONL case file (blank lines skipped).
pub fn read(path: &std::path::Path) -> Result<Vec<Case>, CasesError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(IoError::at("cannot read", path))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| CasesError::Json {
                path: shown.clone(),
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// [`MathVerifier`]'s verdict (the default, lenient one: any marker or the last number).
pub fn judge(case: &Case) -> bool {
    MathVerifier::default()
        .score(&case.answer, &case.gold)
        .value
        >= 1.0
}

/// Agreement of a grader's verdicts with the human ones.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Agreement {
    pub cases: usize,
    pub agree: usize,
    /// Cases the grader credits that the human does not (false positives).
    pub false_credit: usize,
    /// `(kind, cases, agree)`, in order of first appearance.
    pub by_kind: Vec<(String, usize, usize)>,
}

impl Agreement {
    /// The fraction agreed.
    pub fn rate(&self) -> f64 {
        self.agree as f64 / self.cases.max(1) as f64
    }
}

/// How often `verdicts` (one per case) agree with the cases' human verdicts.
pub fn agreement(cases: &[Case], verdicts: &[bool]) -> Agreement {
    let mut a = Agreement::default();
    for (c, &v) in cases.iter().zip(verdicts) {
        a.cases += 1;
        let ok = v == c.human;
        a.agree += usize::from(ok);
        a.false_credit += usize::from(v && !c.human);
        match a.by_kind.iter_mut().find(|(k, _, _)| *k == c.kind) {
            Some(e) => {
                e.1 += 1;
                e.2 += usize::from(ok);
            }
            None => a.by_kind.push((c.kind.clone(), 1, usize::from(ok))),
        }
    }
    a
}
