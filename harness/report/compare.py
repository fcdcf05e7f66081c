"""`memdefrag compare A B`: did a change move any answer, and by how much?

A and B are run folders or folders holding runs (sweeps, result trees). Runs are paired by their resolved
config, less the settings that do not change an answer (threads, logger, resume) and the keys given with
--ignore (e.g. paths, seeds). For each pair: the questions whose output changed (both outputs), correctness
flips, every other recorded value that moved (the target's density rank, memory size, LongBench's
metrics, a probe's ranks), the per-step metrics' deltas, and the time ratio B/A per phase. Text must be
equal; numbers within --tol (absolute, default 1e-6: float noise), what another model scores from the
answer's text (BERTScore) within --tol-scored (default 1e-4: it moves with that model's library, e.g. a
transformers release, when no answer moved); timings never fail unless --max-slowdown is given; the phases
that raised a GPU's memory peak (`peak_mb`) are not compared. Exit 0 when every pair is equal, 1 otherwise, 2 on
bad input. A Markdown report goes to stdout (or --markdown FILE) and a machine-readable one to --json FILE.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from evals.stats import mcnemar
from harness.errors import ConfigError, OneLineParser, stops_on_config_error
from harness.results.paths import writable_file
from harness.results.folder import ResultFolder, as_of_now, atomic_write, read_config
from harness.report.migrate import records_now
from harness.results.summary import phase_totals, run_folders

IDENTITY = ("group", "step", "position", "subset", "id", "layer")     # what names a question within a run
MEASURED = ("seconds", "peak_mb")     # how long and how much memory: the machine's, not the answer's
IGNORED = (*ResultFolder.FREE, "reuse_formed", "formation_batch")    # settings that change no answer
SCORED = ("bertscore",)                # numbers computed by another model from the answer's text


@dataclass
class Tolerance:
    numbers: float = 1e-6                  # absolute, on every recorded number and metric
    max_slowdown: float | None = None      # B/A total time above this fails (None: timings never fail)
    scored: float = 1e-4                   # absolute, on what another model scores (SCORED): it moves with that
                                           # model's library (BERTScore's embeddings), not with the answer

    def of(self, name: str) -> float:
        """The tolerance on the recorded value or metric `name`."""
        return self.scored if name in SCORED else self.numbers


@dataclass
class PairReport:
    """What differs between run A and run B of one config."""

    name: str
    a: str
    b: str
    changed: list[dict] = field(default_factory=list)      # {question, field, a, b}
    flips: list[dict] = field(default_factory=list)        # {question, a, b} of `correct`
    missing: list[dict] = field(default_factory=list)      # questions answered on one side only
    metrics: list[dict] = field(default_factory=list)      # {row, metric, a, b, delta} beyond tolerance
    time_ratio: dict[str, float] = field(default_factory=dict)
    slow: bool = False

    @property
    def equal(self) -> bool:
        return not (self.changed or self.flips or self.missing or self.metrics or self.slow)

    @property
    def chance(self) -> dict:
        """Whether the correctness flips are more than chance: right only in A, right only in B, and McNemar's
        exact p of that split (the questions both got right or both got wrong say nothing)."""
        lost = sum(1 for f in self.flips if f["a"] and not f["b"])
        gained = len(self.flips) - lost
        return {"right_only_in_a": lost, "right_only_in_b": gained, "mcnemar_p": mcnemar(lost, gained)}


def runs_in(root: Path) -> list[Path]:
    """Run folders at or below `root`."""
    if not root.is_dir():
        raise ConfigError(f"{root}: no such folder (give a run folder or a folder holding runs)")
    found = run_folders(root)
    if not found:
        raise ConfigError(f"{root} holds no run (a folder with config.yaml and predictions.jsonl)")
    return found


def config_key(folder: Path, ignore: tuple[str, ...]) -> str:
    """The run's resolved config less the ignored keys (dotted), as a canonical string."""
    config = as_of_now(OmegaConf.to_container(read_config(folder), resolve=False))
    for key in (*IGNORED, *ignore):
        parts = key.split(".")
        node = config
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(parts[-1], None)
    return json.dumps(config, sort_keys=True, default=str)


def paired(a_runs: list[Path], b_runs: list[Path], ignore: tuple[str, ...]):
    """(name, a folder or None, b folder or None) for every config on either side: every run of a config on one
    side against every run of it on the other (a side holding it twice is compared twice, never dropped)."""
    a_keys, b_keys = defaultdict(list), defaultdict(list)
    for keys, runs in ((a_keys, a_runs), (b_keys, b_runs)):
        for folder in runs:
            keys[config_key(folder, ignore)].append(folder)
    for key in sorted(a_keys.keys() | b_keys.keys(), key=lambda k: str((a_keys.get(k) or b_keys.get(k))[0])):
        lefts, rights = a_keys.get(key, [None]), b_keys.get(key, [None])
        for a, b in itertools.product(lefts, rights):
            several = len(lefts) > 1 or len(rights) > 1
            yield (f"{a.name if a else '-'} vs {b.name if b else '-'}" if several else (a or b).name), a, b


def question_of(record: dict) -> tuple:
    return tuple((k, record[k]) for k in IDENTITY if k in record)


def compare_runs(name: str, a: Path, b: Path, tolerance: Tolerance) -> PairReport:
    report = PairReport(name, str(a), str(b))
    left, right = ({question_of(r): r for r in records_now(folder)} for folder in (a, b))   # an older run's too
    for question in sorted(left.keys() ^ right.keys(), key=str):
        report.missing.append({"question": dict(question), "in": "A" if question in left else "B"})
    for question in sorted(left.keys() & right.keys(), key=str):
        x, y = left[question], right[question]
        for key in sorted((x.keys() | y.keys()) - set(IDENTITY) - set(MEASURED)):
            if same(x.get(key), y.get(key), tolerance.of(key)):
                continue
            entry = {"question": dict(question), "field": key, "a": x.get(key), "b": y.get(key)}
            (report.flips if key == "correct" else report.changed).append(entry)
    report.metrics = metric_deltas(a, b, tolerance)
    report.time_ratio = time_ratios(left.values(), right.values())
    if tolerance.max_slowdown is not None and report.time_ratio.get("total", 1.0) > tolerance.max_slowdown:
        report.slow = True
    return report


def same(x, y, tol: float) -> bool:
    """Equal text and structure; numbers within `tol`."""
    if isinstance(x, bool) or isinstance(y, bool) or isinstance(x, str) or isinstance(y, str):
        return x == y
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return x == y or abs(x - y) <= tol or (x != x and y != y)            # NaN == NaN here
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(same(x[k], y[k], tol) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(same(p, q, tol) for p, q in zip(x, y))
    return x == y


def metric_deltas(a: Path, b: Path, tolerance: Tolerance) -> list[dict]:
    """Per row of metrics.csv (a step, a layer, a subset): every number that moved beyond its tolerance."""
    files = [folder / "metrics.csv" for folder in (a, b)]
    if not all(f.is_file() for f in files):
        return []
    left, right = (pd.read_csv(f) for f in files)
    keys = [c for c in left.columns if not pd.api.types.is_numeric_dtype(left[c]) or c in IDENTITY]
    out = []
    for (_, x), (_, y) in zip(left.iterrows(), right.iterrows()):
        row = {k: x[k] for k in keys if k in x}
        for column in (c for c in left.columns if c not in keys and c in right.columns):
            if not same(float(x[column]), float(y[column]), tolerance.of(column)):
                out.append({"row": row, "metric": column, "a": float(x[column]), "b": float(y[column]),
                            "delta": float(y[column]) - float(x[column])})
    if len(left) != len(right):
        out.append({"row": {}, "metric": "rows", "a": len(left), "b": len(right), "delta": len(right) - len(left)})
    return out


def time_ratios(left, right) -> dict[str, float]:
    """B/A of the seconds summed over the questions both answered, per phase and in total."""
    def totals(records):
        sums = phase_totals(records)
        sums["total"] = sum(sums.values())
        return sums
    x, y = totals(left), totals(right)
    return {phase: y[phase] / x[phase] for phase in x if phase in y and x[phase] > 0}


def markdown(reports: list[PairReport], unpaired: list[tuple[str, str | None, str | None]]) -> str:
    lines = [f"# memdefrag compare: {sum(r.equal for r in reports)} of {len(reports)} paired runs equal"
             + (f", {len(unpaired)} runs without a pair" if unpaired else "")]
    for name, a, b in unpaired:
        lines.append(f"- **{name}**: only in {'A' if a else 'B'} ({a or b})")
    for report in reports:
        verdict = "equal" if report.equal else "DIFFERENT"
        ratio = report.time_ratio.get("total")
        lines.append(f"\n## {report.name}: {verdict}" + (f" (time B/A {ratio:.2f}x)" if ratio else ""))
        lines.append(f"A: `{report.a}`  \nB: `{report.b}`")
        if report.missing:
            lines.append(f"- {len(report.missing)} questions answered on one side only: "
                         + ", ".join(f"{m['question']} ({m['in']})" for m in report.missing[:10]))
        if report.flips:
            chance = report.chance
            verdict = "more than chance" if chance["mcnemar_p"] < 0.05 else "no more than chance"
            lines.append(f"- {len(report.flips)} correctness flips ({chance['right_only_in_a']} right only in A, "
                         f"{chance['right_only_in_b']} right only in B: McNemar's exact p {chance['mcnemar_p']:.2g}, "
                         f"{verdict}): " + ", ".join(f"{f['question']} {f['a']} -> {f['b']}" for f in report.flips[:10]))
        outputs = [c for c in report.changed if c["field"] == "output"]
        if outputs:
            lines.append(f"- {len(outputs)} outputs changed:")
            lines += [f"  - {c['question']}: A `{c['a']!s}` / B `{c['b']!s}`" for c in outputs[:10]]
        others = [c for c in report.changed if c["field"] != "output"]
        if others:
            lines.append(f"- {len(others)} other recorded values changed (first: "
                         + ", ".join(f"{c['question']} {c['field']} {c['a']} -> {c['b']}" for c in others[:5]) + ")")
        if report.metrics:
            frame = pd.DataFrame([{**m["row"], "metric": m["metric"], "A": m["a"], "B": m["b"], "delta": m["delta"]}
                                  for m in report.metrics])
            lines.append(frame.to_markdown(index=False, floatfmt=".4g"))
        if report.time_ratio:
            lines.append("- time B/A: " + ", ".join(f"{p} {v:.2f}x" for p, v in sorted(report.time_ratio.items())))
    return "\n".join(lines) + "\n"


def compare(a: Path, b: Path, ignore: tuple[str, ...] = (), tolerance: Tolerance = Tolerance()):
    """(reports of the paired runs, unpaired runs)."""
    reports, unpaired = [], []
    for name, left, right in paired(runs_in(a), runs_in(b), ignore):
        if left is None or right is None:
            unpaired.append((name, str(left) if left else None, str(right) if right else None))
        else:
            reports.append(compare_runs(name, left, right, tolerance))
    return reports, unpaired


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="memdefrag compare", description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--ignore", nargs="*", default=[], help="config keys (dotted) that do not pair runs")
    parser.add_argument("--tol", type=float, default=Tolerance.numbers, help="absolute tolerance on numbers")
    parser.add_argument("--tol-scored", type=float, default=Tolerance.scored,
                        help="absolute tolerance on what another model scores (BERTScore)")
    parser.add_argument("--max-slowdown", type=float, default=None, help="fail when B takes longer than this x A")
    parser.add_argument("--markdown", type=Path, help="write the report here instead of stdout")
    parser.add_argument("--json", type=Path, help="also write a machine-readable report here")
    args = parser.parse_args(argv)
    with stops_on_config_error("memdefrag compare"):
        for option, value in (("--tol", args.tol), ("--tol-scored", args.tol_scored)):
            if value < 0:
                raise ConfigError(f"{option} {value} must be >= 0")
        if args.max_slowdown is not None and args.max_slowdown <= 0:
            raise ConfigError(f"--max-slowdown {args.max_slowdown} must be > 0")
        for option, path in (("--markdown", args.markdown), ("--json", args.json)):
            if path is not None:
                writable_file(option, path)
        reports, unpaired = compare(args.a, args.b, tuple(args.ignore), Tolerance(args.tol, args.max_slowdown,
                                                                                      args.tol_scored))
    text = markdown(reports, unpaired)
    if args.markdown:
        atomic_write(args.markdown, text)
    else:
        print(text, end="")
    if args.json:
        atomic_write(args.json, json.dumps({"equal": all(r.equal for r in reports) and not unpaired,
                                            "pairs": [{**vars(r), "equal": r.equal, "chance": r.chance} for r in reports],
                                            "unpaired": [{"name": n, "a": a, "b": b} for n, a, b in unpaired]},
                                           indent=1, default=str))
    sys.exit(0 if all(r.equal for r in reports) and not unpaired else 1)
