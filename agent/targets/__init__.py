"""What a target is, however it was named: a harness folder, `--hf`, graphmode.toml, a calling convention."""
