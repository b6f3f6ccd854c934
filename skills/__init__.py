"""Graph-mode knowledge the agent cites; Markdown files with front matter."""
