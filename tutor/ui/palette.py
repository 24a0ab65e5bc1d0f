"""Text colours every theme of the app can be read in: WCAG 2.1 AA contrast (4.5:1 for normal text).

Textual's themes set the CSS colours (`$foreground`, `$text-muted`, ...); Rich renderables inside the
app name ANSI colours ("green", "yellow") that Textual maps to a terminal theme (Monokai on a dark
theme, Alabaster on a light one), and "dim" text that a terminal blends towards its background. On the
light theme several of those ANSI colours fell to 2-3:1, Rich's Markdown headings were underlined
magenta (the look of a link), and a terminal's "dim" is about half way to the background (3:1 on the
light theme). This module computes, from the current theme's own background and surface:

- `readable_terminal_theme`: the ANSI colours moved towards the theme's foreground just until each
  reaches AA_TEXT against both backgrounds (colours that already do are kept as they are);
- `heading_styles`: Markdown headings in bold, in the theme's accent colour made readable the same way,
  never underlined (underlined coloured text reads as a link);
- `DIM_FACTOR`: how far "dim" text goes towards the background (tutor.ui.app applies it with
  Textual's DimFilter), chosen so that dim foreground text stays above AA_TEXT on the built-in themes.

The contrast ratio is WCAG 2.1's: (L1 + 0.05) / (L2 + 0.05) of the relative luminances, lighter
first (https://www.w3.org/TR/WCAG21/#dfn-contrast-ratio, with relative luminance as defined at
https://www.w3.org/TR/WCAG21/#dfn-relative-luminance; the 4.5:1 minimum is success criterion 1.4.3,
https://www.w3.org/TR/WCAG21/#contrast-minimum).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.terminal_theme import TerminalTheme
from textual.color import Color

AA_TEXT = 4.5
"""WCAG 2.1 success criterion 1.4.3 (AA): the minimum contrast ratio of normal text."""
TARGET = 4.6
"""What colours are moved to: a little above AA_TEXT, so rounding to 8-bit channels never lands below it."""
DIM_FACTOR = 0.75
"""Share of the text colour kept by "dim" text (Textual's DimFilter: 0 is the background, 1 no change).
Textual's default when it dims is 0.5: 3.0:1 for the light theme's foreground, under AA."""


def _linear(channel: int) -> float:
    """One sRGB channel (0-255) linearised, as WCAG 2.1's relative luminance defines it."""
    value = channel / 255
    return value / 12.92 if value <= 0.04045 else ((value + 0.055) / 1.055) ** 2.4


def relative_luminance(color: Color) -> float:
    """WCAG 2.1 relative luminance: 0.2126 R + 0.7152 G + 0.0722 B of the linearised channels
    (https://www.w3.org/TR/WCAG21/#dfn-relative-luminance). 0 for black, 1 for white."""
    return 0.2126 * _linear(color.r) + 0.7152 * _linear(color.g) + 0.0722 * _linear(color.b)


def contrast_ratio(first: Color, second: Color) -> float:
    """WCAG 2.1 contrast ratio (L1 + 0.05) / (L2 + 0.05), L1 the lighter: 1 (same) to 21 (black on white)
    (https://www.w3.org/TR/WCAG21/#dfn-contrast-ratio). Colours with alpha are taken over `second`."""
    shown = second + first if first.a < 1 else first
    lighter, darker = sorted((relative_luminance(shown), relative_luminance(second)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def readable(color: Color, backgrounds: Sequence[Color], toward: Color, target: float = TARGET) -> Color:
    """`color` if it reaches `target` against every background, else the first blend of it towards
    `toward` (the theme's foreground) that does, in steps of 1/64: the hue kept as far as it can be."""
    color = color.with_alpha(1.0)

    def worst(candidate: Color) -> float:
        return min(contrast_ratio(candidate, background) for background in backgrounds)

    if worst(color) >= target:
        return color
    for step in range(1, 65):
        candidate = color.blend(toward, step / 64)
        if worst(candidate) >= target:
            return candidate
    return toward


ANSI_NAMES = ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white", "bright_black", "bright_red",
              "bright_green", "bright_yellow", "bright_blue", "bright_magenta", "bright_cyan", "bright_white")
"""The 16 ANSI colours in a rich TerminalTheme's order."""
# Used as backgrounds under text of the other extreme ("bold black on cyan" lanes), never as text on
# the theme's own background: moving them would break those pairs.
BACKGROUND_ANSI = {"dark": ("black",), "light": ("white", "bright_white")}


def readable_terminal_theme(base: TerminalTheme, backgrounds: Sequence[Color], foreground: Color,
                            dark: bool) -> TerminalTheme:
    """`base` with every ANSI text colour readable on `backgrounds` (readable(), towards `foreground`);
    black on a dark theme and white on a light one stay: they serve as backgrounds of the other extreme."""
    kept = BACKGROUND_ANSI["dark" if dark else "light"]
    colors = []
    for index, name in enumerate(ANSI_NAMES):
        color = Color(*base.ansi_colors[index])  # a rich Palette: indexed, not iterable
        colors.append(color if name in kept else readable(color, backgrounds, foreground))
    background = base.background_color
    return TerminalTheme((background.red, background.green, background.blue),
                         (foreground.r, foreground.g, foreground.b),
                         [(c.r, c.g, c.b) for c in colors[:8]], [(c.r, c.g, c.b) for c in colors[8:]])


def ansi_color(theme: TerminalTheme, name: str) -> Color:
    """An ANSI colour ("green", "bright_black") as `theme` maps it."""
    red, green, blue = theme.ansi_colors[ANSI_NAMES.index(name)]
    return Color(red, green, blue)


def heading_color(accent: Color, backgrounds: Sequence[Color], foreground: Color) -> Color:
    """The colour of headings: the theme's accent (orange on Textual's themes, never a link's blue),
    made readable on the theme's backgrounds."""
    return readable(accent, backgrounds, foreground)


def heading_styles(heading: Color, code: Color) -> dict[str, str]:
    """Rich's Markdown styles for the app: headings bold in `heading` (levels 1-3) or the text's own colour
    (4-6), none underlined; inline code bold in `code`, on the theme's background (Rich's default puts
    it on black, unreadable once cyan is darkened for a light theme)."""
    hex_heading, hex_code = heading.hex6, code.hex6
    return {"markdown.h1": f"bold {hex_heading}", "markdown.h2": f"bold {hex_heading}",
            "markdown.h3": f"bold {hex_heading}", "markdown.h4": "bold italic", "markdown.h5": "italic",
            "markdown.h6": "italic", "markdown.h7": "italic", "markdown.code": f"bold {hex_code}",
            "markdown.code_block": hex_code, "markdown.block_quote": "italic"}


def theme_backgrounds(variables: dict[str, str]) -> tuple[Color, Color]:
    """(background, surface) of a theme's CSS variables: the two backgrounds text stands on (screens;
    panels, inputs, the help box and a Select's options)."""
    return Color.parse(variables["background"]), Color.parse(variables["surface"])


def theme_palette(variables: dict[str, str], base: TerminalTheme, dark: bool) -> tuple[TerminalTheme, dict[str, str]]:
    """For a theme's CSS variables (Theme.to_color_system().generate()): the terminal theme its ANSI text
    colours map to, and the Markdown styles of its headings and code (see the module's docstring)."""
    backgrounds = theme_backgrounds(variables)
    foreground = Color.parse(variables["foreground"])
    terminal = readable_terminal_theme(base, backgrounds, foreground, dark)
    heading = heading_color(Color.parse(variables["accent"]), backgrounds, foreground)
    return terminal, heading_styles(heading, ansi_color(terminal, "cyan"))


TEXT_VARIABLES = ("text-primary", "text-secondary", "text-accent", "text-warning", "text-error", "text-success",
                  "foreground-muted", "footer-key-foreground", "footer-description-foreground")
"""Theme variables Textual's widgets and the app's CSS use as the colour of text on the theme's
backgrounds (the light theme's $text-warning was 3.3:1, its footer keys 2.9:1)."""


def readable_variables(variables: dict[str, str]) -> dict[str, str]:
    """A theme's CSS variables with each TEXT_VARIABLES colour readable (readable()) on its background,
    surface, panel and footer; "auto" colours (Textual picks black or white against what is under them) and names a
    theme leaves out are kept."""
    backgrounds = list(theme_backgrounds(variables))
    for name in ("panel", "footer-background"):  # the footer's keys and descriptions stand on these
        value = variables.get(name, "")
        if value and not value.strip().startswith("auto"):
            backgrounds.append(backgrounds[0] + Color.parse(value))
    foreground = Color.parse(variables["foreground"])
    updated = dict(variables)
    for name in TEXT_VARIABLES:
        value = variables.get(name, "")
        if not value or value.strip().startswith("auto"):
            continue
        color = Color.parse(value)
        shown = backgrounds[0] + color if color.a < 1 else color
        better = readable(shown, backgrounds, foreground)
        if better != shown:
            updated[name] = better.hex6
    for name, under in CURSOR_VARIABLES:
        value, back = variables.get(name, "").strip(), variables.get(under, "").strip()
        if not value or not back or back.startswith("auto"):
            continue
        cursor = backgrounds[0] + Color.parse(back)
        if value.startswith("auto"):  # "auto 87%": black or white at that opacity, as Textual resolves it
            share = float(value.split()[1].rstrip("%")) / 100 if len(value.split()) > 1 else 1.0
            text = cursor + cursor.get_contrast_text(share)
        else:
            text = cursor + Color.parse(value)
        # towards white or black, whichever the cursor's colour is further from
        extreme = Color(255, 255, 255) if relative_luminance(cursor) < 0.18 else Color(0, 0, 0)
        better = readable(text, [cursor], extreme)
        if better != text:
            updated[name] = better.hex6
    return updated


CURSOR_VARIABLES = (("block-cursor-foreground", "block-cursor-background"),
                    ("block-cursor-blurred-foreground", "block-cursor-blurred-background"))
"""(text, background) variables of a list's highlighted row: the dark theme's was 3.8:1."""
