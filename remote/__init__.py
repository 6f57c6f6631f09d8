"""A target behind a serving engine: the HTTP clients, the lossless rules, the served target."""
