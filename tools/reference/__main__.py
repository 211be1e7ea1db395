"""`python -m tools.reference yahoo10k|compare|collect|eval …` (`check`) `… pin …` (`pin`)
and `… pin-sa …` (`pin_savae`), which read their own options."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pin"]:
        from tools.reference import pin

        return pin.main(argv[1:])
    if argv[:1] == ["pin-sa"]:  # SA-VAE against He et al.'s sa-vae branch
        from tools.reference import pin_savae

        return pin_savae.main(argv[1:])
    from tools.reference import check

    return check.main(argv)


if __name__ == "__main__":
    sys.exit(main())
