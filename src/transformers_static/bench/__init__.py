"""Pieces of `transformers-static bench`: measurement helpers, the generate variants, and the report."""
