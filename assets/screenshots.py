"""Regenerate the README's screenshots from the real app on this machine.

    python assets/screenshots.py

Writes assets/home.svg, assets/lesson.svg (the first lesson after its measurement ran) and
assets/fit.svg, drawn by Textual at 100x32 from the shipped lessons and this machine's figures.
Progress and settings go to a temporary data dir, so the user's own are untouched.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZE = (100, 32)


async def capture() -> None:
    from tutor.ui.app import TutorApp

    async with TutorApp().run_test(size=SIZE) as pilot:
        await pilot.pause(0.5)
        pilot.app.save_screenshot("home.svg", str(HERE))
        await pilot.press("enter")          # the first lesson
        await pilot.pause(0.5)
        await pilot.press("enter")          # run its opening measurement
        for _ in range(120):
            await pilot.pause(0.1)
            if not getattr(pilot.app, "active_runner", None):
                break
        await pilot.pause(0.5)
        pilot.app.save_screenshot("lesson.svg", str(HERE))
        await pilot.press("escape", "f")    # home, then the fit screen
        await pilot.pause(1.0)
        pilot.app.save_screenshot("fit.svg", str(HERE))


def main() -> None:
    with tempfile.TemporaryDirectory() as data:
        os.environ["TENSOR_TUTOR_DATA_DIR"] = data
        asyncio.run(capture())
    for name in ("home.svg", "lesson.svg", "fit.svg"):
        print(HERE / name)


if __name__ == "__main__":
    main()
