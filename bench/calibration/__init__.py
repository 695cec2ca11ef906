"""Calibration: the hook engine that collects each group's statistics (engine), the memory they take and the
passes that fit a budget (memory), the cache that reads them back or computes what is missing (cache), and the
on-disk format of one group's statistics (group_files)."""
