//! `SeqLayout`: offsets that do not pack the tokens are rejected with the reason.

use rollflash_train::{SeqLayout, TrainError};

#[track_caller]
fn rejects(offsets: &[usize], n: usize, reason: &str) {
    match SeqLayout::new(offsets, n) {
        Err(TrainError::Layout { reason: r }) => assert!(r.contains(reason), "{r}"),
        other => panic!("{offsets:?}/{n}: {other:?}"),
    }
}

#[test]
fn layouts_are_validated() {
    rejects(&[], 3, "no sequence offsets");
    rejects(&[1, 2], 3, "first offset is 1");
    rejects(&[0, 2, 1], 3, "before that of sequence 1");
    rejects(&[0, 4], 3, "past the end");
    let l = SeqLayout::new(&[0, 2, 2, 5], 6).unwrap();
    assert_eq!(l.n_seqs(), 4);
    assert_eq!(l.range(1), 2..2, "empty sequences are allowed");
    assert_eq!(l.range(3), 5..6);
    assert_eq!(l.max_len(), 3);
    assert_eq!(l.seq_ids(), vec![0, 0, 2, 2, 2, 3]);
    assert_eq!(SeqLayout::from_lengths(&[2, 0, 3, 1]), l);
    assert_eq!(SeqLayout::new(&[], 0).unwrap().n_seqs(), 0);
}
