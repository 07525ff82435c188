"""Language games: Wordle played as text, the seeded players that collect its data, datasets of games, and the small
GPT members that learn from them (:mod:`agent`; :mod:`bc_lm`, :mod:`ilql`)."""
