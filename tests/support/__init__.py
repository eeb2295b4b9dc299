"""What tests share: where things are (paths), training states (states), killing a program at a
random moment (processes), the README's code blocks (readme_blocks), and the isolated runner of
`make test-gpu` (run_isolated)."""
