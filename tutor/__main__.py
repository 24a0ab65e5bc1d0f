"""`python -m tutor` is the same program as the `tensor-tutor` command."""

from tutor.cli import main

if __name__ == "__main__":
    main()
