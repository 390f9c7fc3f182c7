"""Text as the models see it: the word vocabulary, (T, N) token windows of captions, a word-level HF tokenizer."""
