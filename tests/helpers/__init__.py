"""Helpers the test modules share (never collected as tests themselves); see tests/README.md."""
