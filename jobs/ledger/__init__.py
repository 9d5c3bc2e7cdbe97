"""The job ledger: states, the batched writer, redaction, retention and operator actions."""
