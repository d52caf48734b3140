"""Editor features as plain functions over a `Session` (no pygls here)."""
