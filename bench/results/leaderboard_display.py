"""The leaderboard's display, from the registries: each task's column label and place, each analysis's section
renderer and each study's (the leaderboard itself names no task, analysis or study)."""

from __future__ import annotations


MARGIN_HELP = ("equivalence margins per task, e.g. lama=0.02 ppl-token=0.02 (points of accuracy as a fraction, nats of "
               "mean NLL): a paired difference whose 90 %% interval lies within +-margin is called equivalent "
               "(defaults: each task's own, see docs/decisions.md)")


def report_display(margins: dict[str, float] | None = None):
    """`margins` ({task: margin}, from --margin) override the tasks' own default equivalence margins."""
    from acbench import analyses
    from acbench import tasks
    from acbench.results.plugged import report_sections
    from acbench.leaderboard.tables import Display

    labels, order, margin = {}, {}, {}
    for name in tasks.known_tasks():
        cls = tasks.get_task(name)
        if cls.label:
            labels[name] = cls.label
        order[name] = cls.order
        if cls.margin is not None:
            margin[name] = cls.margin
    margin.update(check_margins(margins))
    sections = {name: analyses.get_analysis(name).report_section for name in analyses.known_analyses()}
    sections.update(report_sections())  # the summary cells plugged commands store (bench emerge)
    return Display(labels=labels, order=order, sections=sections, margins=margin)


def check_margins(margins, where: str = "--margin", what: str = "margin") -> dict[str, float]:
    """{task: margin} from `--margin lama=0.02 ppl-token=0.02` items (spaces or commas) or a config's mapping: each
    a registered task and a number in (0, 1] (a fraction of accuracy, or nats of mean NLL: a margin of 1 nat already
    lets perplexity differ 2.7x), or one line naming the problem and the fix."""
    import math

    from acbench import tasks
    from acbench.core.errors import UserError, did_you_mean

    if margins is None:
        return {}
    if isinstance(margins, dict):
        pairs = list(margins.items())
    elif isinstance(margins, (list, tuple)) and all(isinstance(m, str) for m in margins):
        pairs = []
        for item in (p.strip() for m in margins for p in m.split(",")):
            task, eq, value = item.partition("=")
            if not item or not eq or not task.strip():
                raise UserError(f"{where} {item!r} is not task={what} (e.g. {where} lama=0.02 ppl-token=0.02)")
            pairs.append((task.strip(), value.strip()))
    else:
        raise UserError(f"{where} must be task={what} items or a mapping of task to {what}, not "
                        f"{type(margins).__name__}")
    out: dict[str, float] = {}
    known = set(tasks.known_tasks())
    for task, value in pairs:
        if not isinstance(task, str) or task not in known:
            raise UserError(f"{where}: unknown task {task!r}." + did_you_mean(str(task), known))
        try:
            m = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            m = math.nan
        if not (math.isfinite(m) and 0 < m <= 1):
            raise UserError(f"{where} {task}={value!r}: a {what} is a number in (0, 1], in the task's comparison "
                            "unit (0.02: two points of accuracy, or 0.02 nats of mean NLL)")
        if task in out:
            raise UserError(f"{where} gives {task} twice ({out[task]:g} and {m:g}): give it once")
        out[task] = m
    return out


def check_reference_name(name, where: str) -> str:
    """A reference of paired comparisons (--vs): dense, or a method name or variant as `bench run` takes it (with its
    allocation after '+'); anything else is one line with the closest name, since a reference no cell can have
    would leave every comparison empty without a word."""
    from acbench import methods
    from acbench.core.errors import UserError

    if not isinstance(name, str) or not name.strip():
        raise UserError(f"{where} {name!r} names no method: pass a method name (see `bench ls methods`) or dense")
    if name == "dense":
        return name
    method = name.split("+", 1)[0]
    try:
        methods.build(method)
    except (KeyError, ValueError, TypeError) as e:
        raise UserError(f"{where} {name!r}: {e.args[0] if e.args else e}") from None
    return name
