"""Running a sweep: what the user asked for, checked and resolved (config, selection), the cells it still lacks
(cells), and computing them on this process or on a Ray cluster (execute, ray_executor); `bench compress`'s one
variant (one_variant)."""
