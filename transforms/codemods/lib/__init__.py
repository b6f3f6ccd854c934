"""What the codemods share: recognisers, insertions and the helper code's text, each with public names."""
