"""Benchmarks that need more than the engine: real projects (tree-sitter, project tests) and the real server."""
