"""The model: where it comes from and how it is opened and checked (sources), its input groups (groups), and the
compressed checkpoint format acbench writes and reads back (checkpoint)."""
