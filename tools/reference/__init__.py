"""seqvae against the reference implementations (He et al. 2019, Li et al. 2020; docs/reference_pins.md):

- `check`: He et al.'s code on yahoo10k with its own training script, and `compare` of its runs
  with seqvae's (Welch intervals);
- `pin` (with `child`, run in the reference's process, and `pin_seqvae`, `pin_table`, seqvae's
  side and the table): the step-for-step pins behind `tests/fixtures/reference/`;
- `speed`: seqvae beside He et al.'s code on the same batches;
- `work_copy`: a clean clone copied outside the repository and patched.

    python -m tools.reference yahoo10k|compare|collect|eval|pin …
    python -m tools.reference.speed --he CLONE …
"""
