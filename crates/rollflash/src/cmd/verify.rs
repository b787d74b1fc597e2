//! `rollflash verify`: the math verifier on one response, or on a case set with human
//! verdicts (`scripts/verifier_cases.jsonl`), printing one JSON verdict per case and the
//! agreement rate (what `scripts/verifier_agreement.py` compares with HF math-verify).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use rollflash_env::envs::dataset_task::AnswerRule;
use rollflash_env::envs::DatasetTaskConfig;
use rollflash_env::verify::math::Rule;
use rollflash_env::verify::{cases, MathVerifier, Verifier};

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A JSONL case set: `{"kind", "gold", "answer", "human"}` per line.
    #[arg(long, conflicts_with_all = ["reference", "response"])]
    cases: Option<PathBuf>,
    /// The reference answer (a bare answer, or a solution with `\boxed{}` / `####`).
    #[arg(long, requires = "response")]
    reference: Option<String>,
    /// The model's response.
    #[arg(long, requires = "reference")]
    response: Option<String>,
    /// Score JSON lines `{"reference": …, "response": …}` from stdin, one `{"reward": …}`
    /// line each (flushed), as a dataset task with these `extract` rules and
    /// `format_weight = 0` rewards them: an outside trainer gets exactly our grader.
    #[arg(long, conflicts_with_all = ["cases", "reference", "response"])]
    stdin: bool,
    /// With `--stdin`: the dataset task's `extract` rules, in order (comma-separated:
    /// boxed, answer_tag, hashes, answer_is, last_number); by default the task's default.
    #[arg(long, value_delimiter = ',', requires = "stdin")]
    extract: Vec<String>,
}

pub fn run(a: VerifyArgs) -> Result<()> {
    if a.stdin {
        return score_lines(&a.extract);
    }
    if let Some(path) = a.cases {
        let set = cases::read(&path)?;
        let verdicts: Vec<bool> = set.iter().map(cases::judge).collect();
        for (c, v) in set.iter().zip(&verdicts) {
            println!(
                "{}",
                serde_json::json!({"kind": c.kind, "gold": c.gold, "answer": c.answer,
                                   "human": c.human, "rollflash": v})
            );
        }
        let ag = cases::agreement(&set, &verdicts);
        eprintln!(
            "rollflash MathVerifier: {}/{} agree with the human verdicts ({:.1}%), {} wrong answers credited",
            ag.agree,
            ag.cases,
            100.0 * ag.rate(),
            ag.false_credit
        );
        return Ok(());
    }
    let (Some(reference), Some(response)) = (a.reference, a.response) else {
        bail!("give --cases FILE, or --reference and --response");
    };
    let r = MathVerifier::default().score(&response, &reference);
    println!("{} ({})", r.value, r.detail);
    Ok(())
}

/// `--stdin`: the dataset task's answer reward on each line, until stdin ends.
fn score_lines(extract: &[String]) -> Result<()> {
    use std::io::{BufRead, Write};
    let rules: Vec<Rule> = if extract.is_empty() {
        DatasetTaskConfig::new(Vec::new())
            .extract
            .into_iter()
            .map(Rule::from)
            .collect()
    } else {
        extract
            .iter()
            .map(|name| {
                serde_json::from_value::<AnswerRule>(serde_json::Value::String(name.trim().into()))
                    .map(Rule::from)
                    .map_err(|e| anyhow::anyhow!("--extract `{name}`: {e}"))
            })
            .collect::<Result<_>>()?
    };
    let verifier = MathVerifier::with_rules(&rules);
    let mut out = std::io::stdout().lock();
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| anyhow::anyhow!("stdin line {}: {e}", i + 1))?;
        let field = |k: &str| {
            v[k].as_str()
                .ok_or_else(|| anyhow::anyhow!("stdin line {}: `{k}` must be a string", i + 1))
        };
        let r = verifier.score(field("response")?, field("reference")?);
        writeln!(out, "{}", serde_json::json!({"reward": r.value}))?;
        out.flush()?;
    }
    Ok(())
}
