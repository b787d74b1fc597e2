//! `rollflash verify`: the math verifier on one response, or on a case set with human
//! verdicts (`scripts/verifier_cases.jsonl`), printing one JSON verdict per case and the
//! agreement rate (what `scripts/verifier_agreement.py` compares with HF math-verify).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
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
}

pub fn run(a: VerifyArgs) -> Result<()> {
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
