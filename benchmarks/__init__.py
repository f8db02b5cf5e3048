"""aioelastic's benchmarks: one script per piece, and a runner (``python -m benchmarks``) that runs
them all, side by side with torch.distributed.elastic where torch is installed, and writes a
table, JSON results and plots (see ``docs/benchmarks.md``)."""
