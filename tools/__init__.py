"""The repository's developer tools (not installed with seqvae): run from the repository root,
`python -m tools.<name> …`."""
