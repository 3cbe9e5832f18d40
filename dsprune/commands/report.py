"""``dsprune report``: one table over several ``results.json`` (and ``bench.json``) files, with paired
bootstrap intervals for every difference to the reference model, and a quality-vs-speed PNG."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import formats
from ..errors import DsPruneError


@dataclass
class Args:
    results: list[str] = field(default_factory=list, metadata={"help": "results.json files or eval folders"})
    out: str = field(default="", metadata={"help": "output folder (report.md, report.json, quality_vs_speed.png)"})
    bench: list[str] = field(default_factory=list, metadata={"help": "bench.json files or bench folders"})
    reference: Optional[str] = field(default=None, metadata={"help": "label or path of the reference "
                                                                     "(default: the first results file)"})
    labels: list[str] = field(default_factory=list, metadata={"help": "one label per results file"})
    speed: str = field(default="document", metadata={"help": "speed-up on the plot's x axis: document | query"})
    samples: int = 2000
    seed: int = 0
    overwrite: bool = False


def run(args: Args) -> int:
    from ..report import compare, front

    if not args.results:
        raise DsPruneError("give --results FILE ... (results.json files or eval folders)")
    if not args.out:
        raise DsPruneError("give --out FOLDER")
    if args.speed not in ("document", "query"):
        raise DsPruneError(f"--speed must be document or query, not {args.speed!r}")
    formats.check_output(args.out, args.overwrite)
    entries = compare.load_entries(args.results, args.bench, args.labels or None)
    ref = 0
    if args.reference is not None:
        match = [i for i, e in enumerate(entries) if args.reference in (e.label, str(e.path))
                 or Path(args.reference).resolve() == e.path.resolve()]
        if not match:
            raise DsPruneError(f"reference {args.reference!r} is none of the results given "
                               f"({', '.join(e.label for e in entries)})")
        ref = match[0]
    table = compare.compare(entries, ref, args.samples, args.seed)
    md = compare.markdown(table)
    has_speed = any(r["speed"] for r in table["rows"]) and bool(table["tasks"])   # plot: nDCG@10 vs speed
    with formats.output_dir(args.out, args.overwrite) as tmp:
        formats.write_json(tmp / "report.json", table)
        (tmp / "report.md").write_text(md + "\n")
        if has_speed:
            front.plot(table, tmp / "quality_vs_speed.png", args.speed)
        formats.write_manifest(tmp, "report", {"results": args.results, "bench": args.bench},
                               dataclasses.asdict(args),
                               {r["label"]: r["mean"] for r in table["rows"]})
    print(md)
    print(f"wrote {Path(args.out) / 'report.md'}" + (f" and {Path(args.out) / 'quality_vs_speed.png'}"
                                                      if has_speed else " (no plot: needs bench files and nDCG@10)"))
    return 0
