"""Command-line entry points (click). Each command imports its layer lazily, so `--help` is instant."""
