"""``python -m tileops``: the same command line as the ``tileops`` console script."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
