"""Results: the store that writes one file per cell atomically, with the environment and provenance it records
(store); how the leaderboard displays them, from the registries (leaderboard_display) and what plugs in from above
(plugged: a study's command and its cells' report sections); `bench smoke`'s verdict over stored cells
(smoke_verdict)."""
