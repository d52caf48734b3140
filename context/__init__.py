"""Repository -> ordered, hashed, tokenized segments (no MLX import)."""
