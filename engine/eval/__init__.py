"""Fidelity harness: generated long-context tasks and a runner comparing attention policies."""
