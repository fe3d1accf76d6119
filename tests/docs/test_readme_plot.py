"""The README's replay plot is what the README's command draws: scripts/plot_readme_replay.py runs that command."""

import re
import runpy
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
SCRIPT = "scripts/plot_readme_replay.py"


def quick_start_tiering_args():
    """The arguments of the ``tiering`` command in the quick start's console block."""
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for body in re.findall(r"^```console\n(.*?)^```", section, re.S | re.M):
        for line in body.splitlines():
            for command in line.split("&&"):
                argv = shlex.split(command)
                if argv and Path(argv[0]).name == "tiering":
                    return argv[1:]
    raise AssertionError("the quick start has no tiering command")


def test_the_plot_script_runs_the_readmes_command_and_the_readme_names_it():
    script = runpy.run_path(str(REPO / SCRIPT), run_name="imported")
    assert script["README_COMMAND"] == quick_start_tiering_args()
    image = re.search(r"!\[[^\]]*\]\(([^)]+\.png)\)", README.split("## Quick start", 1)[1])
    assert image is not None and image.group(1) == str(script["PLOT"])
    assert (REPO / image.group(1)).is_file()
    before_image = README[: README.index(image.group(0))]
    assert f"`{SCRIPT}`" in before_image.rstrip().rsplit("\n\n", 1)[-1]  # named in the paragraph that shows the plot
