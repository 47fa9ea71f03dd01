"""The demo: a sample store and the command that consolidates it."""
