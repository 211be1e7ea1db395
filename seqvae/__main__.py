"""`python -m seqvae …`: the same entry point as the `seqvae` command."""

from seqvae.commands import main

if __name__ == "__main__":
    main()
