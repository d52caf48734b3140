"""Tag queries (tree-sitter .scm files), kept as data."""
