"""The leaderboard's display, from the registries: each task's column label and place, each analysis's section
renderer and each study's (the leaderboard itself names no task, analysis or study)."""

from __future__ import annotations


def report_display():
    import analyses
    import tasks
    from bench.results.plugged import report_sections
    from leaderboard.tables import Display

    labels, order = {}, {}
    for name in tasks.known_tasks():
        cls = tasks.get_task(name)
        if cls.label:
            labels[name] = cls.label
        order[name] = cls.order
    sections = {name: analyses.get_analysis(name).report_section for name in analyses.known_analyses()}
    sections.update(report_sections())  # the summary cells plugged commands store (bench emerge)
    return Display(labels=labels, order=order, sections=sections)
