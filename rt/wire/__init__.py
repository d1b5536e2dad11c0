"""Between a process and a card: the messages, the channels (in-process, Unix socket), shared segments."""
