"""Which attnlab source files one command runs code in.

    python -m tests.call_path translate --model RUN "ein Satz"

runs ``attnlab ARGS`` in this process under a profiler hook (``sys.setprofile``) and prints
two lists of files under ``attnlab/``:

* **called**: files in which a function or method ran for the command (not while a module was
  being imported: a call with a module body on the stack is import-time work);
* **imported only**: files whose module body ran (their classes and functions were defined)
  but none of whose functions were called.

``nn/`` files are counted apart: the developers' guide keeps its one-concept files and counts
the redesign's "at most 10 files" outside ``nn/``. The command's own output goes to stdout as
usual; the report goes to stderr, or as JSON to ``--json FILE``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "attnlab"


def trace(argv: list[str]) -> tuple[int, dict[str, list[str]]]:
    """Run ``attnlab argv``; its exit code, and the files called and only imported."""
    called: set[str] = set()
    imported: set[str] = set()
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

    sys.setprofile(hook)
    try:
        from attnlab.cli import main

        code = main(argv)
    finally:
        sys.setprofile(None)
    outside = sorted(f for f in called if not f.startswith("attnlab/nn/"))
    return code, {"called": outside,
                  "called_nn": sorted(f for f in called if f.startswith("attnlab/nn/")),
                  "imported_only": sorted(imported - called)}


def main() -> int:
    args = sys.argv[1:]
    out = None
    if args[:1] == ["--json"]:
        out, args = args[1], args[2:]
    code, files = trace(args)
    if out:
        Path(out).write_text(json.dumps(files, indent=1))
    else:
        print(f"\nfunctions ran in {len(files['called'])} files outside nn/:", file=sys.stderr)
        for f in files["called"]:
            print(f"  {f}", file=sys.stderr)
        print(f"and in {len(files['called_nn'])} files of nn/: "
              f"{', '.join(Path(f).name for f in files['called_nn'])}", file=sys.stderr)
        print(f"imported only (module body ran, no function called): "
              f"{len(files['imported_only'])} files", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
