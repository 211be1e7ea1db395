"""The elapsed-time format of every progress line (epochs, tests, sweep cells). Torch-free, so
that the tools that print it (`seqvae sweep`) start without torch."""


def clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"
