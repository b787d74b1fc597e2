//! Built-in environments: math (RLVR), FrozenLake, Sokoban, tool use, and the registry that builds one from its config.
