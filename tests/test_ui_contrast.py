"""Every text colour of the app against the background it stands on, in the dark and the light theme:
WCAG 2.1 AA asks 4.5:1 of normal text (success criterion 1.4.3). The ratio is WCAG 2.1's
((L1 + 0.05) / (L2 + 0.05) of the relative luminances, https://www.w3.org/TR/WCAG21/#dfn-contrast-ratio),
computed by tutor.ui.palette and checked here against the figures WCAG's examples and WebAIM publish.

Covered: the CSS colour of every widget on the Home, Fit and Bench screens and of their text component
classes (footer keys, ticks and labels of the charts, option lists, a Select's prompt), the ANSI colours
Rich text names ("green", "yellow", "bright_black"), dim text (Textual's DimFilter at palette.DIM_FACTOR)
and the Markdown headings of lessons and help.
"""

from __future__ import annotations

from pathlib import Path

import pytest


from tests.ui_fakes import fake_services, sync

from rich.color import Color as RichColor
from textual.color import Color
from textual.filter import dim_color
from textual.widget import Widget

from tutor.ui import palette
from tutor.ui.app import TutorApp

THEMES = ("textual-dark", "textual-light")
"""The dark and the light theme the app offers (Textual's own; the default is the dark one)."""

# Component classes that draw lines or fills, not text: WCAG asks 3:1 of such graphics (1.4.11), and
# their colour is the bar's or the cursor's, not a reader's.
GRAPHIC_COMPONENTS = {"bar--bar", "bar--complete", "bar--indeterminate", "plot--axis", "input--cursor",
                      "input--selection", "option-list--separator", "toast--title"}
# Component classes Textual draws only in states the screens here never show (a hovered or disabled option).
UNSHOWN_COMPONENTS = {"option-list--option-hover", "option-list--option-disabled"}


def test_the_contrast_ratio_is_wcags():
    white, black = Color(255, 255, 255), Color(0, 0, 0)
    assert palette.relative_luminance(white) == 1 and palette.relative_luminance(black) == 0
    assert palette.contrast_ratio(black, white) == pytest.approx(21)
    assert palette.contrast_ratio(white, white) == pytest.approx(1)
    # WebAIM's contrast checker: #767676 on white is 4.54:1 (the lightest grey that passes AA), #777777 4.48:1.
    assert round(palette.contrast_ratio(Color.parse("#767676"), white), 2) == 4.54
    assert round(palette.contrast_ratio(Color.parse("#777777"), white), 2) == 4.48


def test_readable_moves_a_colour_only_as_far_as_it_must():
    light = Color.parse("#E0E0E0")
    yellow = Color.parse("#FFD700")  # 1.3:1 on the light background
    moved = palette.readable(yellow, [light], Color.parse("#1F1F1F"))
    assert palette.contrast_ratio(moved, light) >= palette.AA_TEXT
    assert palette.contrast_ratio(moved.blend(yellow, 0.1), light) < palette.TARGET  # not much darker than needed
    dark_blue = Color.parse("#004578")
    assert palette.readable(dark_blue, [light], Color.parse("#1F1F1F")) == dark_blue  # already readable: kept


def shown_color(widget: Widget) -> tuple[Color, Color]:
    """(text colour as drawn, background) of a widget: its colour over its background (alpha blended)."""
    _, _, background, color = widget.colors
    return background + color, background


def component_colors(widget: Widget, background: Color) -> dict[str, tuple[Color, Color]]:
    """Each text component class of the widget: (text colour, background) as Textual styles it."""
    names = set()
    for cls in type(widget).__mro__:
        names |= set(getattr(cls, "COMPONENT_CLASSES", ()) or ())
    colors = {}
    for name in sorted(names - GRAPHIC_COMPONENTS - UNSHOWN_COMPONENTS):
        style = widget.get_component_rich_style(name)  # as drawn: combined with the widget's, "auto" resolved
        if style.color is None:
            continue
        back = Color.from_rich_color(style.bgcolor) if style.bgcolor is not None else background
        colors[name] = (Color.from_rich_color(style.color), back)
    return colors


async def screen_failures(app: TutorApp) -> list[str]:
    failures = []
    for widget in app.screen.query("*"):
        if not widget.display or not widget.visible or widget.region.area == 0:
            continue
        color, background = shown_color(widget)
        pairs = {"text": (color, background), **component_colors(widget, background)}
        for part, (fore, back) in pairs.items():
            ratio = palette.contrast_ratio(fore, back)
            if ratio < palette.AA_TEXT:
                failures.append(f"{type(widget).__name__}#{widget.id} {part}: {fore.hex} on {back.hex} = {ratio:.2f}")
    return failures


@pytest.fixture
def bench_run(tmp_path, monkeypatch):
    from tests.plot_data import HEADER, RESULTS

    from tutor.bench.notebook import append_run

    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    append_run(HEADER, RESULTS, tmp_path / "results.jsonl")


@pytest.mark.parametrize("theme", THEMES)
@sync
async def test_every_widgets_text_reaches_aa_on_home_fit_and_bench(theme, bench_run):
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        app.theme = theme
        await pilot.pause()
        failures = await screen_failures(app)
        app.action_fit()
        await pilot.pause()
        failures += await screen_failures(app)
        app.action_bench()
        for _ in range(200):
            await pilot.pause()
            if app.screen.query("#matmul-chart") and app.screen.query_one("#matmul-chart").chart is not None:
                break
        failures += await screen_failures(app)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("theme", THEMES)
@sync
async def test_rich_text_colours_dim_text_and_headings_reach_aa(theme):
    app = TutorApp(fake_services())
    async with app.run_test(size=(80, 24)) as pilot:
        app.theme = theme
        await pilot.pause()
        variables = app.current_theme.to_color_system().generate()
        backgrounds = palette.theme_backgrounds(variables)
        foreground = Color.parse(variables["foreground"])
        kept = palette.BACKGROUND_ANSI["dark" if app.current_theme.dark else "light"]
        terminal = app.ansi_theme
        for name in palette.ANSI_NAMES:
            if name in kept:
                continue
            for background in backgrounds:
                ratio = palette.contrast_ratio(palette.ansi_color(terminal, name), background)
                assert ratio >= palette.AA_TEXT, (theme, name, background.hex, ratio)
        for background in backgrounds:
            # Textual's DimFilter: the text colour blended towards the background by DIM_FACTOR.
            dimmed = dim_color(background.rich_color, foreground.rich_color, palette.DIM_FACTOR)
            assert palette.contrast_ratio(Color.from_rich_color(dimmed), background) >= palette.AA_TEXT, theme
            for level in ("h1", "h2", "h3"):
                style = app.console.get_style(f"markdown.{level}")
                assert style.color is not None and not style.underline, (theme, level)
                heading = Color.from_rich_color(style.color)
                assert palette.contrast_ratio(heading, background) >= palette.AA_TEXT, (theme, level)
        # Headings are not a link's colour: they are the accent's hue (orange), not blue.
        h2 = app.console.get_style("markdown.h2").color
        assert isinstance(h2, RichColor)
        red, _, blue = h2.get_truecolor()
        assert red > blue, (theme, h2)
        assert any(isinstance(f, type(app._dim_filter)) and f.dim_factor == palette.DIM_FACTOR
                   for f in app.get_line_filters())
