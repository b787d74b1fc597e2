//! A small arithmetic expression evaluator shared by the math and countdown verifiers.
//!
//! Besides numbers it reads, in the math grammar, `n!`, `\binom{n}{k}`, `\log_b x`, `\ln x`,
//! `\sqrt[n]{x}`, plain-text `sqrt(x)`/`log(x)`/`ln(x)`, `√x`, e-notation (`1.5e3`), and
//! variables (single letters, Greek commands, longer words as one name) bound by the caller
//! ([`evaluate_with`]): two expressions over the same variables are compared by value at a few
//! fixed rational points ([`crate::verify::math`]), which is how `2b+3a` meets `3a+2b`.
//!
//! Hand-written recursive descent over a token list. Arithmetic is exact (`i128` rationals with
//! checked operations) as long as it can be; a result that overflows, an irrational square
//! root or `\pi` falls back to `f64` ([`Number::Approx`]), and equality then uses a relative
//! tolerance. Work is bounded by construction, so no input can overflow the stack, panic or
//! hang: inputs longer than [`MAX_EXPR_CHARS`] are refused before lexing, nesting deeper than
//! [`MAX_DEPTH`] is refused while parsing, and exact powers only run for small exponents.

use std::fmt;

/// Longest expression (in characters) the parser accepts. Real answers are a few dozen
/// characters; the cap bounds the work an adversarial response can cause.
pub const MAX_EXPR_CHARS: usize = 1024;

/// Deepest nesting (parentheses, braces, unary signs, exponents) the parser accepts. Each
/// level costs a handful of stack frames, so this keeps recursion far from any stack limit.
pub const MAX_DEPTH: usize = 64;

/// Largest `n` of `n!` and of `\binom{n}{k}` (`33!` is the largest factorial in `i128`).
const MAX_FACTORIAL: i128 = 33;
const MAX_BINOM_N: i128 = 120;

/// Largest `n` of `\sqrt[n]{x}`.
const MAX_ROOT_INDEX: i128 = 64;

/// Largest exponent computed exactly; larger ones go through `f64`, so `2^{10^9}` costs the
/// same as `2^3`.
const MAX_EXACT_EXPONENT: i128 = 4096;

/// Relative tolerance for comparing values where at least one side is not exact.
pub const REL_TOLERANCE: f64 = 1e-6;

/// An exact rational number: `num / den` in lowest terms with `den > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rational {
    num: i128,
    den: i128,
}

/// Greatest common divisor, at least 1 (so dividing by it is always safe).
fn gcd(a: i128, b: i128) -> i128 {
    // `unsigned_abs` avoids the `i128::MIN.abs()` overflow.
    let (mut x, mut y) = (a.unsigned_abs(), b.unsigned_abs());
    while y != 0 {
        (x, y) = (y, x % y);
    }
    // Only `gcd(MIN, MIN)` does not fit; not reducing is then correct, merely slower.
    i128::try_from(x).unwrap_or(1).max(1)
}

impl Rational {
    /// `num / den` reduced to lowest terms; `None` when `den == 0` or the sign cannot be
    /// normalised without overflow.
    pub fn new(num: i128, den: i128) -> Option<Rational> {
        if den == 0 {
            return None;
        }
        let g = gcd(num, den);
        let (mut n, mut d) = (num / g, den / g);
        if d < 0 {
            n = n.checked_neg()?;
            d = d.checked_neg()?;
        }
        Some(Rational { num: n, den: d })
    }

    /// The integer `n`.
    pub fn int(n: i128) -> Rational {
        Rational { num: n, den: 1 }
    }

    /// Numerator (carries the sign).
    pub fn numer(&self) -> i128 {
        self.num
    }

    /// Denominator (always positive).
    pub fn denom(&self) -> i128 {
        self.den
    }

    /// The integer value, when the denominator is 1.
    pub fn as_integer(&self) -> Option<i128> {
        (self.den == 1).then_some(self.num)
    }

    /// Nearest `f64`.
    pub fn to_f64(&self) -> f64 {
        self.num as f64 / self.den as f64
    }

    fn checked_add(self, o: Rational) -> Option<Rational> {
        let n = self
            .num
            .checked_mul(o.den)?
            .checked_add(o.num.checked_mul(self.den)?)?;
        Rational::new(n, self.den.checked_mul(o.den)?)
    }

    fn checked_neg(self) -> Option<Rational> {
        Some(Rational {
            num: self.num.checked_neg()?,
            den: self.den,
        })
    }

    fn checked_mul(self, o: Rational) -> Option<Rational> {
        // Cross-reduce first so products of reduced fractions overflow later.
        let g1 = gcd(self.num, o.den);
        let g2 = gcd(o.num, self.den);
        let n = (self.num / g1).checked_mul(o.num / g2)?;
        let d = (self.den / g2).checked_mul(o.den / g1)?;
        Rational::new(n, d)
    }

    fn checked_recip(self) -> Option<Rational> {
        Rational::new(self.den, self.num)
    }

    /// `self^e` for an integer `e` with `|e| <= MAX_EXACT_EXPONENT`; `None` on overflow,
    /// `0^negative` or a too-large exponent.
    fn checked_pow(self, e: i128) -> Option<Rational> {
        if e.unsigned_abs() > MAX_EXACT_EXPONENT.unsigned_abs() {
            return None;
        }
        let base = if e < 0 { self.checked_recip()? } else { self };
        let mut exp = e.unsigned_abs();
        let mut acc = Rational::int(1);
        let mut sq = base;
        while exp > 0 {
            if exp & 1 == 1 {
                acc = acc.checked_mul(sq)?;
            }
            exp >>= 1;
            if exp > 0 {
                sq = sq.checked_mul(sq)?;
            }
        }
        Some(acc)
    }

    /// The exact square root when numerator and denominator are perfect squares.
    fn exact_sqrt(self) -> Option<Rational> {
        if self.num < 0 {
            return None;
        }
        let n = isqrt(self.num)?;
        let d = isqrt(self.den)?;
        Rational::new(n, d)
    }
}

/// The integer square root of `v` when `v` is a perfect square.
fn isqrt(v: i128) -> Option<i128> {
    if v < 0 {
        return None;
    }
    // f64 gets within a few units; correct the guess exactly around it.
    let guess = (v as f64).sqrt() as i128;
    (guess.saturating_sub(2)..=guess.saturating_add(2))
        .find(|r| *r >= 0 && r.checked_mul(*r) == Some(v))
}

impl fmt::Display for Rational {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den == 1 {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

/// A value: exact when every step was rational and fit `i128`, else an `f64` approximation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// Exactly this rational.
    Exact(Rational),
    /// Approximately this finite float.
    Approx(f64),
}

impl Number {
    /// The value as `f64`.
    pub fn to_f64(&self) -> f64 {
        match self {
            Number::Exact(r) => r.to_f64(),
            Number::Approx(x) => *x,
        }
    }

    /// The exact value, if there is one.
    pub fn exact(&self) -> Option<Rational> {
        match self {
            Number::Exact(r) => Some(*r),
            Number::Approx(_) => None,
        }
    }

    /// Equality: exact comparison when both sides are exact, else `|a-b| <= 1e-6·max(|a|,|b|)`
    /// (with a tiny absolute floor so values that round to zero compare equal).
    pub fn equivalent(&self, other: &Number) -> bool {
        match (self, other) {
            (Number::Exact(a), Number::Exact(b)) => a == b,
            _ => {
                let (a, b) = (self.to_f64(), other.to_f64());
                let scale = a.abs().max(b.abs());
                (a - b).abs() <= (REL_TOLERANCE * scale).max(1e-12)
            }
        }
    }

    fn approx(x: f64) -> Result<Number, ExprError> {
        if x.is_finite() {
            Ok(Number::Approx(x))
        } else {
            Err(ExprError::NonFinite)
        }
    }

    fn neg(self) -> Result<Number, ExprError> {
        match self {
            Number::Exact(r) => match r.checked_neg() {
                Some(n) => Ok(Number::Exact(n)),
                None => Number::approx(-r.to_f64()),
            },
            Number::Approx(x) => Ok(Number::Approx(-x)),
        }
    }

    fn binary(
        self,
        o: Number,
        exact: impl Fn(Rational, Rational) -> Option<Rational>,
        float: impl Fn(f64, f64) -> f64,
    ) -> Result<Number, ExprError> {
        if let (Number::Exact(a), Number::Exact(b)) = (self, o) {
            if let Some(r) = exact(a, b) {
                return Ok(Number::Exact(r));
            }
        }
        Number::approx(float(self.to_f64(), o.to_f64()))
    }

    fn add(self, o: Number) -> Result<Number, ExprError> {
        self.binary(o, Rational::checked_add, |a, b| a + b)
    }

    fn sub(self, o: Number) -> Result<Number, ExprError> {
        self.add(o.neg()?)
    }

    fn mul(self, o: Number) -> Result<Number, ExprError> {
        self.binary(o, Rational::checked_mul, |a, b| a * b)
    }

    /// `self / o`, exact where both are; division by zero is an error.
    pub fn quotient(self, o: Number) -> Result<Number, ExprError> {
        if o.to_f64() == 0.0 && o.exact().is_none_or(|r| r.numer() == 0) {
            return Err(ExprError::DivisionByZero);
        }
        self.binary(o, |a, b| a.checked_mul(b.checked_recip()?), |a, b| a / b)
    }

    fn pow(self, e: Number) -> Result<Number, ExprError> {
        if let (Number::Exact(b), Some(k)) = (self, e.exact().and_then(|r| r.as_integer())) {
            if b.numer() == 0 && k < 0 {
                return Err(ExprError::DivisionByZero);
            }
            if let Some(r) = b.checked_pow(k) {
                return Ok(Number::Exact(r));
            }
        }
        Number::approx(self.to_f64().powf(e.to_f64()))
    }

    fn sqrt(self) -> Result<Number, ExprError> {
        if let Some(r) = self.exact().and_then(Rational::exact_sqrt) {
            return Ok(Number::Exact(r));
        }
        let x = self.to_f64();
        if x < 0.0 {
            return Err(ExprError::NonFinite);
        }
        Number::approx(x.sqrt())
    }

    /// The real `k`-th root for an integer `1 <= k <= MAX_ROOT_INDEX`: exact when numerator and
    /// denominator are perfect powers, negative for an odd root of a negative number, an
    /// error for an even root of one.
    fn root(self, k: Number) -> Result<Number, ExprError> {
        let k = k
            .exact()
            .and_then(|r| r.as_integer())
            .filter(|k| (1..=MAX_ROOT_INDEX).contains(k))
            .ok_or(ExprError::NonFinite)?;
        let x = self.to_f64();
        if x < 0.0 && k % 2 == 0 {
            return Err(ExprError::NonFinite);
        }
        if let Some(r) = self.exact() {
            let exact = int_root(r.numer().unsigned_abs(), k)
                .zip(int_root(r.denom().unsigned_abs(), k))
                .and_then(|(n, d)| Rational::new(if r.numer() < 0 { -n } else { n }, d));
            if let Some(e) = exact {
                return Ok(Number::Exact(e));
            }
        }
        Number::approx(x.signum() * x.abs().powf(1.0 / k as f64))
    }
}

/// The integer `k`-th root of `v` when `v` is a perfect `k`-th power.
fn int_root(v: u128, k: i128) -> Option<i128> {
    let v = i128::try_from(v).ok()?;
    let e = u32::try_from(k).ok()?;
    // f64 gets within a unit; check the neighbours exactly.
    let guess = (v as f64).powf(1.0 / k as f64).round() as i128;
    (guess.saturating_sub(1)..=guess.saturating_add(1))
        .find(|r| *r >= 0 && r.checked_pow(e) == Some(v))
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Number::Exact(r) => r.fmt(f),
            Number::Approx(x) => write!(f, "~{x}"),
        }
    }
}

/// Why an expression could not be evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExprError {
    /// Nothing to evaluate.
    #[error("empty expression")]
    Empty,
    /// Longer than [`MAX_EXPR_CHARS`].
    #[error("expression longer than {MAX_EXPR_CHARS} characters")]
    TooLong,
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("expression nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// A character or command outside the grammar.
    #[error("unexpected {found:?} at character {pos}")]
    Unexpected { pos: usize, found: String },
    /// The expression ended where more was needed.
    #[error("unexpected end of expression")]
    UnexpectedEnd,
    /// Division by zero (including `0^{-1}`).
    #[error("division by zero")]
    DivisionByZero,
    /// An infinite or NaN intermediate (overflowing float, square root of a negative).
    #[error("value is not a finite real number")]
    NonFinite,
    /// A variable without a value.
    #[error("variable {0:?} has no value")]
    Unbound(String),
    /// `n!` or `\binom{n}{k}` of something other than small non-negative integers.
    #[error("factorial or binomial of a value that is not a small non-negative integer")]
    Combinatorics,
}

/// Which constructs the parser accepts. The math verifier wants LaTeX and powers; the
/// countdown game allows only integers, the four operations and parentheses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grammar {
    /// LaTeX: `\frac{a}{b}` (and `\frac12`), `\sqrt{x}`, `\pi`, `\cdot`, `\times`, `\div`,
    /// braces as grouping, implicit multiplication before `(`, `\sqrt` and `\pi`, mixed
    /// numbers (`2\frac12` = 2.5).
    pub latex: bool,
    /// Unary `+` and `-`.
    pub unary: bool,
    /// `^` (right-associative).
    pub power: bool,
    /// Decimal literals such as `0.5` and `.5`, and e-notation (`1.5e3`).
    pub decimals: bool,
    /// Variables, `!`, `\binom`, logarithms and the plain-text functions (see the module
    /// docs).
    pub symbols: bool,
}

impl Grammar {
    /// Everything: the grammar of math answers.
    pub const MATH: Grammar = Grammar {
        latex: true,
        unary: true,
        power: true,
        decimals: true,
        symbols: true,
    };
    /// Integers, `+ - * /` (also `×`, `÷`), unary minus and parentheses: the countdown game.
    /// Unary signs are allowed because the games' own checkers allow them (TinyZero evaluates
    /// the expression; reasoning-gym 0.1.25's generator answers `-1 + (20 - 8)/1`).
    pub const COUNTDOWN: Grammar = Grammar {
        latex: false,
        unary: true,
        power: false,
        decimals: false,
        symbols: false,
    };
}

/// An evaluated expression and the numeric literals it used, in order of appearance (the
/// countdown verifier checks them against the numbers it gave out).
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluated {
    /// The value.
    pub value: Number,
    /// Every numeric literal, as written.
    pub literals: Vec<Number>,
}

/// Evaluates `input` under `grammar`; a variable is an error ([`ExprError::Unbound`]).
pub fn evaluate(input: &str, grammar: Grammar) -> Result<Evaluated, ExprError> {
    evaluate_with(input, grammar, &[])
}

/// The variables `input` uses (sorted, each once), when it lexes.
pub fn variables(input: &str, grammar: Grammar) -> Result<Vec<String>, ExprError> {
    if input.chars().count() > MAX_EXPR_CHARS {
        return Err(ExprError::TooLong);
    }
    let (_, mut names) = lex(input, grammar)?;
    names.sort();
    names.dedup();
    Ok(names)
}

/// Evaluates `input` with the variables bound to `values` (`(name, value)`, names as
/// [`variables`] reports them).
pub fn evaluate_with(
    input: &str,
    grammar: Grammar,
    values: &[(String, Number)],
) -> Result<Evaluated, ExprError> {
    if input.chars().count() > MAX_EXPR_CHARS {
        return Err(ExprError::TooLong);
    }
    let (tokens, names) = lex(input, grammar)?;
    if tokens.is_empty() {
        return Err(ExprError::Empty);
    }
    let mut bound = Vec::with_capacity(names.len());
    for n in &names {
        match values.iter().find(|(k, _)| k == n) {
            Some((_, v)) => bound.push(*v),
            None => return Err(ExprError::Unbound(n.clone())),
        }
    }
    let mut p = Parser {
        tokens: &tokens,
        pos: 0,
        depth: 0,
        grammar,
        literals: Vec::new(),
        vars: &bound,
    };
    let value = p.sum()?;
    if let Some(t) = p.tokens.get(p.pos) {
        return Err(t.unexpected());
    }
    Ok(Evaluated {
        value,
        literals: p.literals,
    })
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tok {
    Num(Number),
    Plus,
    Minus,
    Star,
    Slash,
    Caret,
    Open(char),
    Close(char),
    Frac,
    Sqrt,
    Pi,
    /// Variable `i` of the lexer's name table.
    Var(usize),
    Bang,
    Binom,
    /// `\log` (base 10 unless `_b` follows) and `\ln`.
    Log,
    Ln,
    Underscore,
}

#[derive(Debug, Clone, Copy)]
struct Token {
    tok: Tok,
    /// Character offset, for error messages.
    pos: usize,
}

impl Token {
    fn unexpected(&self) -> ExprError {
        let found = match self.tok {
            Tok::Num(n) => n.to_string(),
            Tok::Plus => "+".into(),
            Tok::Minus => "-".into(),
            Tok::Star => "*".into(),
            Tok::Slash => "/".into(),
            Tok::Caret => "^".into(),
            Tok::Open(c) | Tok::Close(c) => c.to_string(),
            Tok::Frac => "\\frac".into(),
            Tok::Sqrt => "\\sqrt".into(),
            Tok::Pi => "\\pi".into(),
            Tok::Var(_) => "a variable".into(),
            Tok::Bang => "!".into(),
            Tok::Binom => "\\binom".into(),
            Tok::Log => "\\log".into(),
            Tok::Ln => "\\ln".into(),
            Tok::Underscore => "_".into(),
        };
        ExprError::Unexpected {
            pos: self.pos,
            found,
        }
    }
}

/// Greek letters read as variables.
const GREEK: [&str; 16] = [
    "alpha", "beta", "gamma", "delta", "epsilon", "theta", "lambda", "mu", "nu", "rho", "sigma",
    "tau", "phi", "psi", "omega", "varphi",
];

/// The tokens of `input` and the variable names they refer to (`Tok::Var(i)` is `names[i]`).
fn lex(input: &str, g: Grammar) -> Result<(Vec<Token>, Vec<String>), ExprError> {
    let chars: Vec<char> = input.chars().collect();
    let mut out = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut i = 0;
    let unexpected = |pos: usize, found: String| ExprError::Unexpected { pos, found };
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        let simple = match c {
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '+' => Some(Tok::Plus),
            '-' | '\u{2212}' => Some(Tok::Minus),
            '*' | '\u{00d7}' | '\u{22c5}' => Some(Tok::Star),
            '/' | '\u{00f7}' => Some(Tok::Slash),
            '^' if g.power => Some(Tok::Caret),
            '(' => Some(Tok::Open('(')),
            ')' => Some(Tok::Close(')')),
            '[' if g.latex => Some(Tok::Open('[')),
            ']' if g.latex => Some(Tok::Close(']')),
            '{' if g.latex => Some(Tok::Open('{')),
            '}' if g.latex => Some(Tok::Close('}')),
            '\u{03c0}' if g.latex => Some(Tok::Pi),
            '\u{00b7}' => Some(Tok::Star),
            '\u{221a}' if g.symbols => Some(Tok::Sqrt),
            '!' if g.symbols => Some(Tok::Bang),
            '_' if g.symbols => Some(Tok::Underscore),
            _ => None,
        };
        if let Some(tok) = simple {
            out.push(Token { tok, pos: start });
            i += 1;
            // `\log_28` is `\log_2 8`: as in LaTeX, an unbraced subscript is one character
            // (spaces are gone after normalisation).
            if tok == Tok::Underscore {
                if let Some(d) = chars.get(i).and_then(|c| c.to_digit(10)) {
                    out.push(Token {
                        tok: Tok::Num(Number::Exact(Rational::int(i128::from(d)))),
                        pos: i,
                    });
                    i += 1;
                }
            }
            continue;
        }
        if c.is_ascii_digit() || (c == '.' && g.decimals) {
            let (tok, end) = lex_number(&chars, i, g)?;
            out.push(tok);
            i = end;
            continue;
        }
        if g.symbols && c.is_ascii_alphabetic() {
            i = lex_word(&chars, i, &mut out, &mut names);
            continue;
        }
        if c == '\\' && g.latex {
            i = lex_command(&chars, i, g, &mut out, &mut names)?;
            continue;
        }
        return Err(unexpected(start, c.to_string()));
    }
    Ok((out, names))
}

/// The variable `name`: its index in `names`, where it is added the first time.
fn var_token(name: String, names: &mut Vec<String>) -> Tok {
    let i = names.iter().position(|n| *n == name).unwrap_or_else(|| {
        names.push(name);
        names.len() - 1
    });
    Tok::Var(i)
}

/// The number starting at `i` (digits, a decimal part, an exponent, as `g` allows), and
/// where it ends.
fn lex_number(chars: &[char], i: usize, g: Grammar) -> Result<(Token, usize), ExprError> {
    let mut j = i;
    while j < chars.len() && chars[j].is_ascii_digit() {
        j += 1;
    }
    let int_end = j;
    let mut frac_end = j;
    if g.decimals && j < chars.len() && chars[j] == '.' {
        frac_end = j + 1;
        while frac_end < chars.len() && chars[frac_end].is_ascii_digit() {
            frac_end += 1;
        }
    }
    if int_end == i && frac_end <= int_end + 1 {
        return Err(ExprError::Unexpected {
            pos: i,
            found: chars[i].to_string(),
        });
    }
    let int_part: String = chars[i..int_end].iter().collect();
    let frac_part: String = if frac_end > int_end {
        chars[int_end + 1..frac_end].iter().collect()
    } else {
        String::new()
    };
    let mut value = parse_decimal(&int_part, &frac_part)?;
    let mut end = frac_end;
    // E-notation: `1.5e3`, `2.5E-4` (an `e` followed by digits, else a variable).
    if g.decimals && matches!(chars.get(end), Some('e' | 'E')) {
        let mut k = end + 1;
        let neg = chars.get(k) == Some(&'-');
        if matches!(chars.get(k), Some('-' | '+')) {
            k += 1;
        }
        let digits_start = k;
        while k < chars.len() && chars[k].is_ascii_digit() && k - digits_start < 4 {
            k += 1;
        }
        if k > digits_start && !chars.get(k).is_some_and(char::is_ascii_digit) {
            let e: String = chars[digits_start..k].iter().collect();
            let e: i128 = e.parse().map_err(|_| ExprError::NonFinite)?;
            let scale = Number::Exact(Rational::int(10))
                .pow(Number::Exact(Rational::int(if neg { -e } else { e })))?;
            value = value.mul(scale)?;
            end = k;
        }
    }
    Ok((
        Token {
            tok: Tok::Num(value),
            pos: i,
        },
        end,
    ))
}

/// The word starting at `start` (`g.symbols`): a function's name, `pi`, or variables,
/// pushed to `out`. Returns where it ends.
fn lex_word(chars: &[char], start: usize, out: &mut Vec<Token>, names: &mut Vec<String>) -> usize {
    let mut j = start;
    while j < chars.len() && chars[j].is_ascii_alphabetic() {
        j += 1;
    }
    let word: String = chars[start..j].iter().collect();
    match word.as_str() {
        "sqrt" => out.push(Token {
            tok: Tok::Sqrt,
            pos: start,
        }),
        "log" => out.push(Token {
            tok: Tok::Log,
            pos: start,
        }),
        "ln" => out.push(Token {
            tok: Tok::Ln,
            pos: start,
        }),
        "pi" => out.push(Token {
            tok: Tok::Pi,
            pos: start,
        }),
        // Two letters or fewer are a product of one-letter variables (`ab`, `xy`);
        // a longer word is one name, so `yes` and `sey` stay apart.
        w if w.len() <= 2 => {
            for (k, ch) in w.chars().enumerate() {
                let tok = var_token(ch.to_string(), names);
                out.push(Token {
                    tok,
                    pos: start + k,
                });
            }
        }
        w => {
            let tok = var_token(w.to_string(), names);
            out.push(Token { tok, pos: start });
        }
    }
    j
}

/// The LaTeX command whose backslash is at `start` (`g.latex`), with `\frac`'s unbraced
/// one-digit arguments, pushed to `out`. Returns where it ends.
fn lex_command(
    chars: &[char],
    start: usize,
    g: Grammar,
    out: &mut Vec<Token>,
    names: &mut Vec<String>,
) -> Result<usize, ExprError> {
    let mut i = start;
    let mut j = i + 1;
    while j < chars.len() && chars[j].is_ascii_alphabetic() {
        j += 1;
    }
    let name: String = chars[i + 1..j].iter().collect();
    let tok = match name.as_str() {
        "frac" | "dfrac" | "tfrac" => Tok::Frac,
        "sqrt" => Tok::Sqrt,
        "pi" => Tok::Pi,
        "cdot" | "times" => Tok::Star,
        "div" => Tok::Slash,
        "binom" | "dbinom" | "tbinom" if g.symbols => Tok::Binom,
        "log" if g.symbols => Tok::Log,
        "ln" if g.symbols => Tok::Ln,
        n if g.symbols && GREEK.contains(&n) => var_token(format!("\\{n}"), names),
        _ => {
            return Err(ExprError::Unexpected {
                pos: start,
                found: format!("\\{name}"),
            })
        }
    };
    out.push(Token { tok, pos: start });
    i = j;
    if tok == Tok::Frac {
        // `\frac12` means `\frac{1}{2}`: LaTeX takes a single character as an argument,
        // so unbraced digits right after `\frac` are separate one-digit arguments.
        for _ in 0..2 {
            while i < chars.len() && chars[i] == ' ' {
                i += 1;
            }
            match chars.get(i) {
                Some(d) if d.is_ascii_digit() => {
                    let v = i128::from(d.to_digit(10).unwrap_or(0));
                    out.push(Token {
                        tok: Tok::Num(Number::Exact(Rational::int(v))),
                        pos: i,
                    });
                    i += 1;
                }
                _ => break,
            }
        }
    }
    Ok(i)
}

/// `n!` for an exact integer `0 <= n <= 33`.
fn factorial(n: Number) -> Result<Number, ExprError> {
    let n = n
        .exact()
        .and_then(|r| r.as_integer())
        .filter(|n| (0..=MAX_FACTORIAL).contains(n))
        .ok_or(ExprError::Combinatorics)?;
    let mut acc = 1i128;
    for k in 2..=n {
        acc = acc.checked_mul(k).ok_or(ExprError::Combinatorics)?;
    }
    Ok(Number::Exact(Rational::int(acc)))
}

/// `\binom{n}{k}` for exact integers `0 <= k <= n <= 120` (0 when `k > n`).
fn binom(n: Number, k: Number) -> Result<Number, ExprError> {
    let int = |x: Number| x.exact().and_then(|r| r.as_integer());
    let (Some(n), Some(k)) = (int(n), int(k)) else {
        return Err(ExprError::Combinatorics);
    };
    if !(0..=MAX_BINOM_N).contains(&n) || k < 0 {
        return Err(ExprError::Combinatorics);
    }
    if k > n {
        return Ok(Number::Exact(Rational::int(0)));
    }
    let k = k.min(n - k);
    let mut acc = Rational::int(1);
    for i in 0..k {
        acc = acc
            .checked_mul(Rational::new(n - i, i + 1).ok_or(ExprError::Combinatorics)?)
            .ok_or(ExprError::Combinatorics)?;
    }
    Ok(Number::Exact(acc))
}

/// `log_base(x)` (`None`: natural). Exact when `base^k = x` for a small integer `k`.
fn log(x: Number, base: Option<Number>) -> Result<Number, ExprError> {
    if let (Some(b), Some(xr)) = (base.and_then(|b| b.exact()), x.exact()) {
        for k in -64i128..=64 {
            if b.checked_pow(k) == Some(xr) && b != Rational::int(1) {
                return Ok(Number::Exact(Rational::int(k)));
            }
        }
    }
    let xf = x.to_f64();
    if xf <= 0.0 {
        return Err(ExprError::NonFinite);
    }
    match base {
        None => Number::approx(xf.ln()),
        Some(b) => {
            let bf = b.to_f64();
            if bf <= 0.0 || bf == 1.0 {
                return Err(ExprError::NonFinite);
            }
            Number::approx(xf.ln() / bf.ln())
        }
    }
}

/// `int.frac` as an exact rational when it fits, else as a float.
fn parse_decimal(int_part: &str, frac_part: &str) -> Result<Number, ExprError> {
    let digits = format!("{int_part}{frac_part}");
    let exact = digits.parse::<i128>().ok().and_then(|n| {
        let den = u32::try_from(frac_part.len())
            .ok()
            .and_then(|k| 10i128.checked_pow(k))?;
        Rational::new(n, den)
    });
    match exact {
        Some(r) => Ok(Number::Exact(r)),
        None => {
            let text = format!(
                "{}.{}",
                if int_part.is_empty() { "0" } else { int_part },
                if frac_part.is_empty() { "0" } else { frac_part }
            );
            Number::approx(text.parse::<f64>().map_err(|_| ExprError::NonFinite)?)
        }
    }
}

struct Parser<'a> {
    tokens: &'a [Token],
    pos: usize,
    depth: usize,
    grammar: Grammar,
    literals: Vec<Number>,
    /// The value of each variable, by name-table index.
    vars: &'a [Number],
}

impl Parser<'_> {
    fn peek(&self) -> Option<Tok> {
        self.tokens.get(self.pos).map(|t| t.tok)
    }

    fn next(&mut self) -> Result<Token, ExprError> {
        let t = self
            .tokens
            .get(self.pos)
            .copied()
            .ok_or(ExprError::UnexpectedEnd)?;
        self.pos += 1;
        Ok(t)
    }

    /// Whether the last token consumed is an integer literal that is not an exponent, i.e. the
    /// whole part of a mixed number.
    fn after_integer_literal(&self) -> bool {
        let tok = |back: usize| {
            self.pos
                .checked_sub(back)
                .and_then(|i| self.tokens.get(i))
                .map(|t| t.tok)
        };
        let integer = matches!(tok(1), Some(Tok::Num(Number::Exact(r))) if r.denom() == 1);
        integer && tok(2) != Some(Tok::Caret)
    }

    /// Runs `f` one nesting level deeper, refusing past [`MAX_DEPTH`].
    fn nested<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, ExprError>,
    ) -> Result<T, ExprError> {
        if self.depth >= MAX_DEPTH {
            return Err(ExprError::TooDeep);
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        r
    }

    /// sum := product (('+' | '-') product)*
    fn sum(&mut self) -> Result<Number, ExprError> {
        let mut acc = self.product()?;
        loop {
            match self.peek() {
                Some(Tok::Plus) => {
                    self.pos += 1;
                    acc = acc.add(self.product()?)?;
                }
                Some(Tok::Minus) => {
                    self.pos += 1;
                    acc = acc.sub(self.product()?)?;
                }
                _ => return Ok(acc),
            }
        }
    }

    /// product := unary (('*' | '/') unary | implicit)*, where implicit multiplication (LaTeX
    /// only) is a `(`, `\sqrt` or `\pi` right after a factor: `2(3+4)`, `3\sqrt{2}`, `2\pi`.
    /// An integer literal directly followed by `\frac` is a mixed number (`2\frac12` = 2.5),
    /// as in the MATH dataset, not a product.
    fn product(&mut self) -> Result<Number, ExprError> {
        let mut acc = self.unary()?;
        loop {
            match self.peek() {
                Some(Tok::Star) => {
                    self.pos += 1;
                    acc = acc.mul(self.unary()?)?;
                }
                Some(Tok::Slash) => {
                    self.pos += 1;
                    acc = acc.quotient(self.unary()?)?;
                }
                Some(Tok::Open('(') | Tok::Sqrt | Tok::Pi) if self.grammar.latex => {
                    acc = acc.mul(self.power()?)?;
                }
                Some(Tok::Frac) if self.grammar.latex && self.after_integer_literal() => {
                    // A mixed number: `3\frac12` is 3.5 and `-3\frac12` is -3.5.
                    let f = self.power()?;
                    acc = if acc.to_f64() < 0.0 {
                        acc.sub(f)?
                    } else {
                        acc.add(f)?
                    };
                }
                // `2x`, `3\binom{4}{2}`, `x\frac{1}{2}`, `2\ln 2`: implicit products.
                Some(Tok::Var(_) | Tok::Binom | Tok::Log | Tok::Ln | Tok::Frac)
                    if self.grammar.symbols =>
                {
                    acc = acc.mul(self.power()?)?;
                }
                _ => return Ok(acc),
            }
        }
    }

    /// unary := ('+' | '-') unary | power
    fn unary(&mut self) -> Result<Number, ExprError> {
        match self.peek() {
            Some(Tok::Minus) if self.grammar.unary => {
                self.pos += 1;
                self.nested(|p| p.unary())?.neg()
            }
            Some(Tok::Plus) if self.grammar.unary => {
                self.pos += 1;
                self.nested(|p| p.unary())
            }
            _ => self.power(),
        }
    }

    /// power := atom '!'* ('^' unary)?, so `2^3^2 = 2^9`, `2^-1 = 1/2` and `3!^2 = 36`.
    fn power(&mut self) -> Result<Number, ExprError> {
        let mut base = self.atom()?;
        while self.peek() == Some(Tok::Bang) {
            self.pos += 1;
            base = factorial(base)?;
        }
        if self.peek() == Some(Tok::Caret) {
            self.pos += 1;
            let e = self.nested(|p| p.unary())?;
            return base.pow(e);
        }
        Ok(base)
    }

    /// atom := number | '(' sum ')' | '{' sum '}' | '[' sum ']' | \frac arg arg
    ///         | \sqrt ('[' sum ']')? arg | \pi
    fn atom(&mut self) -> Result<Number, ExprError> {
        let t = self.next()?;
        match t.tok {
            Tok::Num(n) => {
                self.literals.push(n);
                Ok(n)
            }
            Tok::Open(open) => self.nested(|p| {
                let v = p.sum()?;
                let close = p.next()?;
                match (open, close.tok) {
                    ('(', Tok::Close(')')) | ('{', Tok::Close('}')) | ('[', Tok::Close(']')) => {
                        Ok(v)
                    }
                    _ => Err(close.unexpected()),
                }
            }),
            Tok::Frac => {
                let a = self.nested(|p| p.argument())?;
                let b = self.nested(|p| p.argument())?;
                a.quotient(b)
            }
            // `\sqrt[3]{2}`: an index in brackets makes it an n-th root.
            Tok::Sqrt if self.grammar.latex && self.peek() == Some(Tok::Open('[')) => {
                self.pos += 1;
                let k = self.nested(|p| p.sum())?;
                let close = self.next()?;
                if close.tok != Tok::Close(']') {
                    return Err(close.unexpected());
                }
                self.nested(|p| p.argument())?.root(k)
            }
            Tok::Sqrt => self.nested(|p| p.argument())?.sqrt(),
            Tok::Pi => Ok(Number::Approx(std::f64::consts::PI)),
            Tok::Var(i) => self.vars.get(i).copied().ok_or(ExprError::UnexpectedEnd),
            Tok::Binom => {
                let n = self.nested(|p| p.argument())?;
                let k = self.nested(|p| p.argument())?;
                binom(n, k)
            }
            Tok::Log | Tok::Ln => {
                let base = match (t.tok, self.peek()) {
                    (Tok::Log, Some(Tok::Underscore)) => {
                        self.pos += 1;
                        Some(self.nested(|p| p.argument())?)
                    }
                    (Tok::Log, _) => Some(Number::Exact(Rational::int(10))),
                    _ => None,
                };
                let x = self.nested(|p| p.argument())?;
                log(x, base)
            }
            _ => Err(t.unexpected()),
        }
    }

    /// A LaTeX argument: a braced group or a single atom (`\frac12`, `\sqrt2`).
    fn argument(&mut self) -> Result<Number, ExprError> {
        self.atom()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(s: &str) -> Number {
        match evaluate(s, Grammar::MATH) {
            Ok(e) => e.value,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn exact_arithmetic() {
        assert_eq!(val("2+3*4"), Number::Exact(Rational::int(14)));
        assert_eq!(
            val("(1/2)^2"),
            Number::Exact(Rational::new(1, 4).unwrap_or(Rational::int(0)))
        );
        assert_eq!(val("2^3^2"), Number::Exact(Rational::int(512)));
        assert_eq!(val("-2^2"), Number::Exact(Rational::int(-4)));
        assert_eq!(val("\\frac12"), val("0.5"));
        assert_eq!(val("\\sqrt{16}"), Number::Exact(Rational::int(4)));
        assert!(matches!(val("\\sqrt{2}"), Number::Approx(_)));
        assert_eq!(val("\\sqrt[3]{8}"), Number::Exact(Rational::int(2)));
        assert_eq!(val("\\sqrt[3]{-\\frac{8}{27}}"), val("-2/3"));
        assert!(val("\\sqrt[3]{2}").equivalent(&val("2^{1/3}")));
        assert!(evaluate("\\sqrt[2]{-4}", Grammar::MATH).is_err());
        assert!(evaluate("\\sqrt[0]{4}", Grammar::MATH).is_err());
    }

    #[test]
    fn overflow_falls_back_to_float() {
        let big = "170141183460469231731687303715884105727";
        assert!(matches!(val(&format!("{big}*{big}")), Number::Approx(_)));
        assert!(evaluate("10^{400}", Grammar::MATH).is_err());
        assert_eq!(val("1^{1000000000}"), Number::Approx(1.0));
    }

    #[test]
    fn depth_is_limited() {
        let deep = format!("{}1{}", "(".repeat(100), ")".repeat(100));
        assert_eq!(evaluate(&deep, Grammar::MATH), Err(ExprError::TooDeep));
        let unary = "-".repeat(200) + "1";
        assert_eq!(evaluate(&unary, Grammar::MATH), Err(ExprError::TooDeep));
    }
}
