"""Benchmarks of seqvae (docs/performance.md): they print figures; tests assert behaviour. Run from
the repository root: `python -m benchmarks.bench …` (throughput, the GEMM peak of `gemm_peak`),
`python -m benchmarks.memory …` (peak RSS of `seqvae test` by test-set size)."""
