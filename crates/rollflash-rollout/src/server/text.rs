//! Output text for the OpenAI routes: stop strings (cut before the match, as vLLM and OpenAI
//! do) and incremental emission for streaming that never sends text a later stop string could
//! take back.
//!
//! Stop strings are found in the detokenized output of the whole generation, so the answer does
//! not depend on how tokens arrived. A token is streamed only once its text is settled: the
//! text up to it does not end in a partial UTF-8 character (U+FFFD) and lies before the last
//! `longest stop − 1` characters, where a stop string could still begin.

use super::{ApiError, Shared};

/// The stop strings of a request and what to do with a match.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stops {
    pub(crate) strings: Vec<String>,
    /// vLLM's `include_stop_str_in_output`: keep the matched string in the text.
    pub(crate) include: bool,
}

impl Stops {
    pub(crate) fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }

    /// Characters at the end of a text that a stop string could still claim.
    fn hold_back(&self) -> usize {
        self.strings
            .iter()
            .map(|s| s.chars().count())
            .max()
            .map_or(0, |n| n.saturating_sub(1))
    }

    /// The earliest match in `text`: its byte offset and the string.
    fn find(&self, text: &str) -> Option<(usize, &str)> {
        self.strings
            .iter()
            .filter_map(|s| text.find(s.as_str()).map(|at| (at, s.as_str())))
            .min_by_key(|(at, _)| *at)
    }
}

/// The final text of an output after stop strings.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cut {
    /// Output tokens kept: up to the one that completed the match (vLLM keeps it too).
    pub(crate) tokens: usize,
    pub(crate) text: String,
    /// The stop string that matched.
    pub(crate) matched: Option<String>,
}

/// Applies `stops` to the output `tokens`.
pub(crate) fn cut(shared: &Shared, tokens: &[u32], stops: &Stops) -> Result<Cut, ApiError> {
    let full = shared.decode(tokens)?;
    if stops.find(&full).is_none() {
        return Ok(Cut {
            tokens: tokens.len(),
            text: full,
            matched: None,
        });
    }
    // The shortest prefix whose text holds a match: prefixes only grow, so bisect.
    let (mut lo, mut hi) = (0usize, tokens.len());
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if stops.find(&shared.decode(&tokens[..mid])?).is_some() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let text = shared.decode(&tokens[..hi])?;
    let (at, s) = stops.find(&text).unwrap_or((text.len(), ""));
    let end = if stops.include { at + s.len() } else { at };
    Ok(Cut {
        tokens: hi,
        text: text[..end].to_string(),
        matched: Some(s.to_string()),
    })
}

/// What to send next: output tokens `start..end` and their text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Piece {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) text: String,
}

/// Streaming state of one choice: how much of its output was sent.
#[derive(Debug, Default)]
pub(crate) struct Emitter {
    tokens: usize,
    chars: usize,
    /// A stop string matched: nothing more is sent until [`Emitter::finish`].
    pub(crate) hit: bool,
}

impl Emitter {
    /// The settled part of `tokens` not sent yet, if any; sets `hit` when a stop string
    /// appeared (the caller ends the generation).
    pub(crate) fn advance(
        &mut self,
        shared: &Shared,
        tokens: &[u32],
        stops: &Stops,
    ) -> Result<Option<Piece>, ApiError> {
        if self.hit || tokens.len() <= self.tokens {
            return Ok(None);
        }
        let full = shared.decode(tokens)?;
        if stops.find(&full).is_some() {
            self.hit = true;
            return Ok(None);
        }
        let limit = full.chars().count().saturating_sub(stops.hold_back());
        let mut n = tokens.len();
        while n > self.tokens {
            let text = if n == tokens.len() {
                full.clone()
            } else {
                shared.decode(&tokens[..n])?
            };
            let chars = text.chars().count();
            if chars <= limit && !text.ends_with('\u{FFFD}') {
                return Ok(Some(self.take(n, &text, chars)));
            }
            n -= 1;
        }
        Ok(None)
    }

    /// Everything left of the final output (`cut` already applied).
    pub(crate) fn finish(&mut self, cut: &Cut) -> Piece {
        let chars = cut.text.chars().count();
        let start = self.tokens.min(cut.tokens);
        let text: String = cut.text.chars().skip(self.chars).collect();
        self.tokens = cut.tokens;
        self.chars = chars.max(self.chars);
        Piece {
            start,
            end: cut.tokens,
            text,
        }
    }

    fn take(&mut self, n: usize, text: &str, chars: usize) -> Piece {
        let piece = Piece {
            start: self.tokens,
            end: n,
            text: text.chars().skip(self.chars).collect(),
        };
        self.tokens = n;
        self.chars = chars.max(self.chars);
        piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_stop_string_wins_and_hold_back_is_longest_minus_one() {
        let stops = Stops {
            strings: vec!["END".into(), "\n\n".into()],
            include: false,
        };
        assert_eq!(stops.find("a\n\nbEND"), Some((1, "\n\n")));
        assert_eq!(stops.find("abc"), None);
        assert_eq!(stops.hold_back(), 2);
        assert_eq!(Stops::default().hold_back(), 0);
    }
}
