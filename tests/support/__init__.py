"""What tests share: where things are (paths), training states (states), killing a program at a
random moment (processes), the code blocks of the README and docs/ (readme_blocks), and the
isolated runner of `make test-gpu` (run_isolated)."""
