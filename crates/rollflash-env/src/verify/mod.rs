//! Verifiers: rewards computed from a finished response (math answer equivalence, format, countdown).
