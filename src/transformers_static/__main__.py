"""`python -m transformers_static ...`: the `transformers-static` command."""

from .commands import main

if __name__ == "__main__":
    raise SystemExit(main())
