//! The procedurally generated arithmetic task (RLVR) with a long tail of solution lengths, and its supervised warm-up data.
