"""The core layer: errors, atomic io and cache folders, settings checks, statistics and rank types, linear
algebra, the plugin registry and the result record. It imports nothing else of acbench."""
