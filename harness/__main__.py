"""`python -m harness`: the `bench` command where its script is not on PATH."""
from harness.entry import main

main()
