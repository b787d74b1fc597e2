//! Datasets of prompts and reference answers: JSONL and Parquet files, and the built-in generators, behind one interface.
