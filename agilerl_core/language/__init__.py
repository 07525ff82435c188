"""Language games: Wordle played as text, the seeded players that collect its data, and datasets of games."""
