"""The chain verify rules' names, torch-free (the REPL's settings and ``--help`` read them without
loading torch); ``generation.verify_rules`` holds the rules under these names."""

# The token rule of Leviathan et al. / Chen et al.; block verification (Sun et al. 2025);
# a draft kept iff it equals the target's own draw.
VERIFY_RULE_NAMES: tuple[str, ...] = ("residual", "block", "strict")
