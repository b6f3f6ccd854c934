"""The codemod that gives a mixture-of-experts layer a dispatch of static shapes."""
