//! API-key comparison shared by every server (`rollflash serve`, `rollflash env-serve`).

/// Compares a presented key with the expected one in time that depends only on the length of
/// `expected`, so response timing reveals nothing about how much of a guessed key was right.
pub fn constant_time_eq(candidate: &[u8], expected: &[u8]) -> bool {
    let mut diff = candidate.len() ^ expected.len();
    for (i, &e) in expected.iter().enumerate() {
        let c = candidate.get(i).copied().unwrap_or(0);
        diff |= usize::from(std::hint::black_box(c ^ e));
    }
    std::hint::black_box(diff) == 0
}
