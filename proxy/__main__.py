"""`python -m proxy` runs the command-line interface."""

from proxy.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
