"""The picture of one call's timeline, as an inline SVG string (architecture.md §9).

Pure: values in (ms after the request was sent), markup out; every text is escaped. The admin
shows it large on a call's page and small in a turn's calls; no script is needed to see it.
What the values are for a recorded call is ``calls.timeline.call_picture``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

BOUND_COLOURS = {
    "before_content": "#c27c0e",
    "between_events": "#8e44ad",
    "flat": "#16a085",
    "absolute": "#566573",
    "whole_call": "#c27c0e",
}
EVENT, KEEPALIVE, MILESTONE, CUT = "#2a6fdb", "#9aa0a6", "#333333", "#d62728"


@dataclass(frozen=True)
class Milestone:
    at: float
    label: str  # "send", "headers", "first content", ...


@dataclass(frozen=True)
class DeadlineMark:
    bound: str  # an calls.bounds.Bound value
    at: float
    cut: bool = False  # the deadline that cut the call
    met: bool = False  # passed before it ran out (the before-content deadline once content came)


@dataclass(frozen=True)
class CallPicture:
    outcome: str  # completed | cut | error | aborted | deferred | "in flight"
    milestones: tuple[Milestone, ...] = ()
    events: tuple[float, ...] = ()
    events_tail: tuple[float, ...] = ()
    events_omitted: int = 0
    keepalives: tuple[float, ...] = ()
    keepalives_tail: tuple[float, ...] = ()
    keepalives_omitted: int = 0
    deadlines: tuple[DeadlineMark, ...] = ()
    cut_at: float | None = None  # when the cut happened: the deadline plus its lateness
    cut_lateness_ms: float | None = None
    end: float | None = None
    notes: tuple[str, ...] = field(default=())


def fmt_ms(ms: float) -> str:
    """A duration as an operator reads it: 850 ms, 1.25 s, 31 min."""
    if not math.isfinite(ms):
        return str(ms)
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 1000:
        return f"{sign}{ms:.0f} ms"
    if ms < 120_000:
        return f"{sign}{ms / 1000:.3g} s" if ms < 10_000 else f"{sign}{ms / 1000:.1f} s"
    return f"{sign}{ms / 60_000:.1f} min"


def bound_label(bound: str) -> str:
    return bound.replace("_", "-")


def _span(p: CallPicture) -> float:
    """The time the chart shows: up to the end, the cut, and the last thing seen."""
    seen = [
        0.0,
        *(m.at for m in p.milestones),
        *p.events,
        *p.events_tail,
        *p.keepalives,
        *p.keepalives_tail,
    ]
    seen += [x for x in (p.end, p.cut_at) if x is not None]
    seen += [d.at for d in p.deadlines if d.cut]
    return max(max(seen) * 1.08, 1.0)


def _ticks(span: float) -> list[float]:
    raw = span / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(span // step) + 1)]


def _title(text: str) -> str:
    return f"<title>{escape(text)}</title>"


def render_svg(p: CallPicture, *, small: bool = False) -> str:
    """The picture as ``<svg>`` markup. ``small``: the compact form for a table row."""
    width, left, right = (320, 6, 6) if small else (760, 92, 24)
    lane_event, lane_keep = (12, 24) if small else (34, 60)
    top, bottom = (4, 34) if small else (18, 84)
    label_rows = () if small else (112, 126, 140)
    height = 40 if small else 164 + 14 * (len(p.deadlines) + len(p.notes))
    span = _span(p)
    plot = width - left - right

    def x(t: float) -> float:
        return round(left + max(0.0, min(t, span)) / span * plot, 1)

    summary = f"call {p.outcome}"
    if p.cut_at is not None:
        summary += f", cut at {fmt_ms(p.cut_at)}"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="call-timeline{" small" if small else ""}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(summary)}" font-family="sans-serif" '
        f'font-size="{9 if small else 11}">',
        _title(
            summary + f"; {len(p.events) + len(p.events_tail) + p.events_omitted} model events, "
            f"{len(p.keepalives) + len(p.keepalives_tail) + p.keepalives_omitted} keepalives"
        ),
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<line x1="{left}" y1="{bottom}" x2="{left + plot}" y2="{bottom}" stroke="#cccccc"/>',
    ]
    if not small:
        parts.append(f'<text x="4" y="{lane_event + 4}" fill="{EVENT}">model events</text>')
        parts.append(f'<text x="4" y="{lane_keep + 4}" fill="{KEEPALIVE}">keepalives</text>')
        for t in _ticks(span):
            parts.append(
                f'<line x1="{x(t)}" y1="{bottom}" x2="{x(t)}" y2="{bottom + 3}" stroke="#999999"/>'
            )
            parts.append(
                f'<text x="{x(t)}" y="{bottom + 13}" text-anchor="middle" fill="#666666">'
                f"{escape(fmt_ms(t))}</text>"
            )

    def ticks(times: tuple[float, ...], lane: int, colour: str, cls: str, what: str) -> None:
        half = 4 if small else 8
        for t in times:
            parts.append(
                f'<line class="{cls}" x1="{x(t)}" y1="{lane - half}" '
                f'x2="{x(t)}" y2="{lane + half}" '
                f'stroke="{colour}" stroke-width="1.2">{_title(f"{what} at {fmt_ms(t)}")}</line>'
            )

    for times, tail, omitted, lane, colour, cls, what in (
        (p.events, p.events_tail, p.events_omitted, lane_event, EVENT, "event", "model event"),
        (
            p.keepalives,
            p.keepalives_tail,
            p.keepalives_omitted,
            lane_keep,
            KEEPALIVE,
            "keepalive",
            "keepalive",
        ),
    ):
        ticks(times, lane, colour, cls, what)
        ticks(tail, lane, colour, cls, what)
        if omitted:
            gap_from = times[-1] if times else 0.0
            gap_to = tail[0] if tail else gap_from
            parts.append(
                f'<text class="omitted" x="{(x(gap_from) + x(gap_to)) / 2}" '
                f'y="{lane - (6 if small else 10)}" '
                f'text-anchor="middle" fill="{colour}">{escape(f"… {omitted} more …")}</text>'
            )

    for i, m in enumerate(p.milestones):
        parts.append(
            f'<line class="milestone" x1="{x(m.at)}" y1="{top}" x2="{x(m.at)}" y2="{bottom}" '
            f'stroke="{MILESTONE}" '
            f'stroke-width="1">{_title(f"{m.label} at {fmt_ms(m.at)}")}</line>'
        )
        if label_rows:
            parts.append(
                f'<text x="{x(m.at) + 2}" y="{label_rows[i % len(label_rows)]}" fill="{MILESTONE}">'
                f"{escape(m.label)} {escape(fmt_ms(m.at))}</text>"
            )

    legend_y = (label_rows[-1] + 18) if label_rows else 0
    for d in p.deadlines:
        colour = CUT if d.cut else BOUND_COLOURS.get(d.bound, "#555555")
        state = "cut the call" if d.cut else ("met" if d.met else "as it stood")
        text = f"{bound_label(d.bound)} deadline {fmt_ms(d.at)} ({state})"
        if d.at <= span:
            parts.append(
                f'<line class="deadline deadline-{escape(d.bound)}" '
                f'x1="{x(d.at)}" y1="{top}" x2="{x(d.at)}" y2="{bottom}" '
                f'stroke="{colour}" stroke-width="1.5" stroke-dasharray="4 3">{_title(text)}</line>'
            )
        else:
            text += ", off the chart"
        if legend_y:
            parts.append(
                f'<text class="deadline-legend" x="{left}" y="{legend_y}" fill="{colour}">'
                f"{escape(text)}</text>"
            )
            legend_y += 14

    if p.cut_at is not None:
        late = (
            f", {fmt_ms(p.cut_lateness_ms)} after its deadline"
            if p.cut_lateness_ms is not None
            else ""
        )
        text = f"cut at {fmt_ms(p.cut_at)}{late}"
        parts.append(
            f'<line class="cut" x1="{x(p.cut_at)}" y1="{top}" x2="{x(p.cut_at)}" y2="{bottom}" '
            f'stroke="{CUT}" '
            f'stroke-width="{2 if small else 3}">{_title(text)}</line>'
        )
        if not small:
            # Beside the cut line, on the side with room for it.
            anchor, at_x = (
                ("end", x(p.cut_at) - 5) if x(p.cut_at) > width / 2 else ("start", x(p.cut_at) + 5)
            )
            parts.append(
                f'<text x="{at_x}" y="{top + 2}" text-anchor="{anchor}" fill="{CUT}" '
                f'font-weight="bold">{escape(text)}</text>'
            )
    elif p.end is not None:
        parts.append(
            f'<line class="end" x1="{x(p.end)}" y1="{top}" x2="{x(p.end)}" y2="{bottom}" '
            f'stroke="{MILESTONE}" '
            f'stroke-width="2">{_title(f"ended ({p.outcome}) at {fmt_ms(p.end)}")}</line>'
        )
    if not small:
        for note in p.notes:
            parts.append(
                f'<text class="note" x="{left}" y="{legend_y}" fill="#666666">{escape(note)}</text>'
            )
            legend_y += 14
    parts.append("</svg>")
    return "".join(parts)
