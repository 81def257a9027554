//! eADR process-kill harness.
