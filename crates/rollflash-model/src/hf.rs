//! placeholder, being written in another worktree
