"""Judging pairs of values: tolerance, comparison records, the verdict."""
