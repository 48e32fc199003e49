"""Which attnlab source files one command runs code in.

    python -m tests.call_path translate --model RUN "ein Satz"

runs ``attnlab ARGS`` in this process under a profiler hook (``sys.setprofile``) and prints
two lists of files under ``attnlab/``:

* **called**: files in which a function or method ran for the command (not while a module was
  being imported: a call with a module body on the stack is import-time work);
* **imported only**: files whose module body ran (their classes and functions were defined)
  but none of whose functions were called;
* **climbs back**: functions of ``cli/`` called from a frame of the decoding layers below it
  (a callback into the command: the decoding pipeline should need none).

``nn/`` and ``cpu/`` files are counted apart: the developers' guide keeps nn/'s one-concept
files, and the CPU decoding engine is the speed machinery beside them; the "at most 10 files"
of a command's path is counted outside both. The command's own output goes to stdout as
usual; the report goes to stderr, or as JSON to ``--json FILE``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "attnlab"
# the layers a command calls down into, which never call back up into cli/
LOWER = ("generation/", "cpu/", "serving/", "nn/", "models/")


def trace(argv: list[str]) -> tuple[int, dict[str, list[str]]]:
    """Run ``attnlab argv``; its exit code, and the files called and only imported."""
    called: set[str] = set()
    imported: set[str] = set()
    climbs: set[str] = set()  # cli/ functions called from below (generation/, cpu/, serving/)
    root = str(PACKAGE) + "/"
    here = sys._getframe()  # the walk up the stack stops here

    def hook(frame, event, arg) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if not filename.startswith(root):
            return
        rel = "attnlab/" + filename[len(root):]
        caller = frame  # a module body on the stack: this call runs during an import
        while caller is not None and caller is not here:
            if caller.f_code.co_name == "<module>":
                imported.add(rel)
                return
            caller = caller.f_back
        called.add(rel)
        if rel.startswith("attnlab/cli/"):
            caller = frame.f_back
            while caller is not None and caller is not here:
                below = caller.f_code.co_filename[len(root):]
                if caller.f_code.co_filename.startswith(root) and below.startswith(LOWER):
                    climbs.add(f"{rel}:{frame.f_code.co_name} from attnlab/{below}")
                    break
                caller = caller.f_back

    sys.setprofile(hook)
    try:
        from attnlab.cli import main

        code = main(argv)
    finally:
        sys.setprofile(None)
    apart = ("attnlab/nn/", "attnlab/cpu/")
    outside = sorted(f for f in called if not f.startswith(apart))
    return code, {"called": outside,
                  "called_nn": sorted(f for f in called if f.startswith("attnlab/nn/")),
                  "called_cpu": sorted(f for f in called if f.startswith("attnlab/cpu/")),
                  "imported_only": sorted(imported - called),
                  "climbs_back": sorted(climbs)}


def main() -> int:
    args = sys.argv[1:]
    out = None
    if args[:1] == ["--json"]:
        out, args = args[1], args[2:]
    code, files = trace(args)
    if out:
        Path(out).write_text(json.dumps(files, indent=1))
    else:
        print(f"\nfunctions ran in {len(files['called'])} files outside nn/ and cpu/:",
              file=sys.stderr)
        for f in files["called"]:
            print(f"  {f}", file=sys.stderr)
        print(f"and in {len(files['called_nn'])} files of nn/: "
              f"{', '.join(Path(f).name for f in files['called_nn'])}", file=sys.stderr)
        print(f"and in {len(files['called_cpu'])} files of cpu/: "
              f"{', '.join(Path(f).name for f in files['called_cpu'])}", file=sys.stderr)
        print(f"imported only (module body ran, no function called): "
              f"{len(files['imported_only'])} files", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
