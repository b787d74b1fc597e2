//! `SeqLayout`: which tokens of a packed batch belong to which sequence.
//!
//! Everything in this crate is *packed*: the tokens of all sequences sit back to back in one
//! `[tokens]` vector, with no padding, and a list of start offsets says where each sequence
//! begins. Sequence-level quantities (GSPO's geometric-mean ratio, per-sequence means, the
//! position of the reward token) are computed through this one type, so the offsets are
//! validated once.

use std::ops::Range;

use crate::error::{Result, TrainError};

/// The sequence boundaries of a packed batch of `n_tokens` tokens.
///
/// Sequence `i` covers tokens `offsets[i] .. offsets[i + 1]` (the last one ends at
/// `n_tokens`). Empty sequences are allowed (two equal offsets); they contribute nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqLayout {
    /// Start index of each sequence; `offsets[0] == 0`, non-decreasing, `<= n_tokens`.
    offsets: Vec<usize>,
    /// Total number of tokens, which is where the last sequence ends.
    n_tokens: usize,
}

impl SeqLayout {
    /// Checks `seq_offsets` (start index of each sequence) against the token count.
    ///
    /// Fails when a token would belong to no sequence (first offset not 0, or tokens but no
    /// sequences), or when offsets decrease or point past the end.
    pub fn new(seq_offsets: &[usize], n_tokens: usize) -> Result<Self> {
        match seq_offsets.first() {
            None if n_tokens > 0 => {
                return Err(TrainError::Layout {
                    reason: format!("{n_tokens} tokens but no sequence offsets"),
                })
            }
            Some(&first) if first != 0 => {
                return Err(TrainError::Layout {
                    reason: format!("first offset is {first}, must be 0"),
                })
            }
            _ => {}
        }
        for (i, pair) in seq_offsets.windows(2).enumerate() {
            if pair[1] < pair[0] {
                return Err(TrainError::Layout {
                    reason: format!(
                        "offset of sequence {} ({}) is before that of sequence {i} ({})",
                        i + 1,
                        pair[1],
                        pair[0]
                    ),
                });
            }
        }
        if let Some(&last) = seq_offsets.last() {
            if last > n_tokens {
                return Err(TrainError::Layout {
                    reason: format!("last offset {last} is past the end ({n_tokens} tokens)"),
                });
            }
        }
        Ok(SeqLayout {
            offsets: seq_offsets.to_vec(),
            n_tokens,
        })
    }

    /// The layout of sequences with the given lengths, packed in order.
    pub fn from_lengths(lengths: &[usize]) -> Self {
        let mut offsets = Vec::with_capacity(lengths.len());
        let mut at = 0;
        for &len in lengths {
            offsets.push(at);
            at += len;
        }
        SeqLayout {
            offsets,
            n_tokens: at,
        }
    }

    /// Number of sequences.
    pub fn n_seqs(&self) -> usize {
        self.offsets.len()
    }

    /// Number of tokens over all sequences.
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Start offset of every sequence.
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// Token range of sequence `i` (panics if `i >= n_seqs()`, like slice indexing).
    pub fn range(&self, i: usize) -> Range<usize> {
        let end = self.offsets.get(i + 1).copied().unwrap_or(self.n_tokens);
        self.offsets[i]..end
    }

    /// Token ranges of all sequences, in order.
    pub fn ranges(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        (0..self.n_seqs()).map(|i| self.range(i))
    }

    /// Length of the longest sequence (0 for an empty batch). The default normaliser of
    /// `seq_mean_token_sum_norm`, playing the part of the padded length in ROLL / verl.
    pub fn max_len(&self) -> usize {
        self.ranges().map(|r| r.len()).max().unwrap_or(0)
    }

    /// For every token, the index of its sequence: the gather/scatter index of
    /// sequence-level tensor ops.
    pub fn seq_ids(&self) -> Vec<u32> {
        let mut ids = Vec::with_capacity(self.n_tokens);
        for (i, r) in self.ranges().enumerate() {
            ids.extend(std::iter::repeat_n(i as u32, r.len()));
        }
        ids
    }

    /// Checks that a per-token input has one entry per token.
    pub(crate) fn check_tokens(&self, name: &'static str, got: usize) -> Result<()> {
        if got == self.n_tokens {
            Ok(())
        } else {
            Err(TrainError::Length {
                name,
                expected: self.n_tokens,
                got,
            })
        }
    }

    /// Checks that a per-sequence input has one entry per sequence.
    pub(crate) fn check_seqs(&self, name: &'static str, got: usize) -> Result<()> {
        if got == self.n_seqs() {
            Ok(())
        } else {
            Err(TrainError::Length {
                name,
                expected: self.n_seqs(),
                got,
            })
        }
    }
}
