"""The comparative tables, `tab:rankers` and `tab:peers`: each accuracy with its interval, each row paired with a
reference row on the same questions, and the claims the text makes of them (harness.report.claims).

A row pools the runs of one model, dataset and method that differ only in `task.seed` (another draw of the
synthetic set, or of the groups from a real one): its interval covers groups and seeds, and a question is
(seed, group, step) wherever rows are paired."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from evals.stats import wilson, with_interval
from harness.report.claims import STEPS, keyed, supported
from harness.results.figures import accuracy_against_time
from harness.report.sections import SHARED_DISTRACTORS, Run, Section, bench_table, labelled, named
from methods.session import UPDATE_PHASES
from methods.window import BEYOND_MARK

ANSWER_PHASES = ("trace", "rank", "select", "prefill", "decode")     # a question's seconds, in the order spent
RANKER_REFERENCE, PEER_REFERENCE = "density top1 latent", "memdefrag_top1"    # what the others are paired with
POOLED_INTERVALS = ("Accuracy: % of the questions at that step, with its 95 % Wilson interval in brackets (n: the "
                    "`groups` column, the groups of every seed together, one question per group and step). "
                    + SHARED_DISTRACTORS + " Each seed draws its own set: a row pooling seeds pools their sets, and "
                    "its interval, taking every question as independent, leaves out how much the sets differ, which "
                    "`last step by seed` shows.")
PAIRED = ("at the last step, the difference in accuracy points against it on the same questions, McNemar's exact "
          "p on the questions only one of the two answered right, and n; p above 0.05 is no measurable difference.")


@dataclass
class Row:
    """One row of a comparative table: the runs of one model, dataset and name over their seeds."""

    model: str
    dataset: str
    name: str
    runs: list[Run]

    @property
    def key(self) -> tuple[str, str, str]:
        """The row as a claim names it (harness.report.claims.keyed)."""
        return self.model, self.dataset, self.name

    @cached_property
    def records(self) -> pd.DataFrame:
        """The finished groups' records of every run, each tagged with its run's seed (read once)."""
        return pd.concat([finished_records(r).assign(seed=r.config["task"].get("seed")) for r in self.runs],
                         ignore_index=True)

    def cells(self, frame: pd.DataFrame, name: str, **columns) -> dict:
        """A row of the table from its pooled records `frame`: model, dataset, `name` (its column) = its name,
        accuracy per step with its interval, `columns`, then how many groups (over the seeds) and seeds."""
        return {"model": self.model, "dataset": self.dataset, name: self.name, **accuracy_by_step(frame), **columns,
                "groups": len(frame[["seed", "group"]].drop_duplicates()), "seeds": frame["seed"].nunique(),
                "last step by seed": by_seed(frame)}


def rows_of(runs: list[Run], names: list[str]) -> list[Row]:
    """Runs pooled by (model, dataset, name), in the order their first run comes."""
    rows: dict[tuple, Row] = {}
    for run, name in zip(runs, names):
        key = (run.model, run.config["task"]["dataset"], name)
        rows.setdefault(key, Row(*key, [])).runs.append(run)
    return list(rows.values())


def variant(method: dict) -> str:
    """A selection run's name: ranker, size rule or window, arrangement, reading."""
    if method["arrangement"] != "best_last":
        keep = f"{method['arrangement']} w{method['window']}"
    else:
        keep = {"topk": f"top{method['k']}", "all": "all",
                "adaptive": f"adaptive tau{method['tau']:g} K<={method['k_max']}"}[method["size"]]
    return f"{method['ranker']} {keep} {method['reading']}"


def finished_records(run: Run) -> pd.DataFrame:
    """The run's records of the groups it finished (every step asked)."""
    frame = pd.DataFrame(run.records)
    return frame[frame.groupby("group")["step"].transform("nunique") == frame["step"].nunique()]


def by_seed(frame: pd.DataFrame) -> str:
    """Accuracy (%) at each seed's last step, seed by seed (`42: 43.3 / 43: 56.7 / 44: 0.0`), that step named where
    it is not the row's last; '' for one seed. The seeds' distractor sets differ, which the pooled Wilson interval,
    taking every question as independent, leaves out."""
    last = frame["step"].max()
    cells = []
    for seed, answers in frame.groupby("seed", sort=True, dropna=False):
        step = answers["step"].max()
        share = answers.loc[answers["step"] == step, "correct"].mean()
        cells.append(f"{seed}: {100 * share:.1f}" + ("" if step == last else f" (step {step})"))
    return " / ".join(cells) if len(cells) > 1 else ""


def accuracy_by_step(frame: pd.DataFrame) -> dict:
    """Accuracy (%) per step (`acc@n`) and its 95 % Wilson interval (`low@n`, `high@n`)."""
    out = {}
    for step, correct in frame.groupby("step")["correct"]:
        low, high = wilson(int(correct.sum()), len(correct))
        out |= {f"acc@{step}": 100 * correct.mean(), f"low@{step}": 100 * low, f"high@{step}": 100 * high}
    return out


def versus(rows: list[Row], reference: str) -> list[str]:
    """Per row, against the `reference` row of the same model and dataset on the same questions at the last
    step: the accuracy difference in points and McNemar's exact p on the questions one of them alone got right
    ('' where there is no reference row). The reference row may be marked as read past its window (named)."""
    references = (reference, f"{reference} {BEYOND_MARK}")
    last = {(r.model, r.dataset): r.records for r in rows if r.name in references}
    out = []
    for row in rows:
        if row.name in references or (row.model, row.dataset) not in last:
            out.append("reference" if row.name in references else "")
            continue
        found = STEPS.compare(row.records, last[row.model, row.dataset], row.records["step"].max())
        out.append(f"{found.accuracy - found.against:+.1f} (p {found.p:.2g}, n {found.n})")
    return out


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """The table as printed: every `acc@n` with its interval (`50.0 [33.2, 66.8]`), the bounds' own columns gone."""
    table = table.copy()
    for column in [c for c in table.columns if c.startswith("acc@")]:
        step = column[4:]
        table[column] = [with_interval(a / 100, lo / 100, hi / 100) for a, lo, hi in
                         zip(table[column], table[f"low@{step}"], table[f"high@{step}"])]
    return table.drop(columns=[c for c in table.columns if c.startswith(("low@", "high@"))])


def ranker_row(row: Row) -> dict:
    """Accuracy (%) per step, the target's hit rates (%), seconds per question and their split."""
    frame = row.records
    seconds = pd.DataFrame(list(frame["seconds"]))
    phases = {phase: seconds[phase].mean() for phase in ANSWER_PHASES if phase in seconds}
    choice = frame[frame["step"] > 1]                   # with one fragment stored every ranker is right
    return row.cells(frame, "variant", **{
        "hit@1": 100 * (choice["target_rank"] == 1).mean(), "hit@2": 100 * (choice["target_rank"] <= 2).mean(),
        "hit@K": 100 * choice["target_read"].mean(), "s/question": sum(phases.values()),
        **{f"s {phase}": value for phase, value in phases.items()},
        "s index/update": seconds["index"].mean() if "index" in seconds else None})


def rankers_section(root, runs, figures) -> Section:
    """`tab:rankers`: attention density against lexical, dense and oracle retrieval (and the floors), each kept
    fragment read as latent memory or as text; one row per model, set and variant, from experiment=rankers and
    rankers_sizes; and the figure of accuracy against time per question."""
    section = Section("tab:rankers", "Which fragments to answer with: accuracy (%) at n updates, the target's hit "
                      "rates after update 1 (%: ranked first, in the first two, among those read), seconds per "
                      "question and split")
    chosen = [r for r in runs if r.study == "rankers"]
    if not chosen:
        section.missing = "no runs yet: memdefrag experiment=rankers and experiment=rankers_sizes"
        return section
    rows = rows_of(chosen, [named(r, variant(r.config["method"])) for r in chosen])
    table = pd.DataFrame([ranker_row(row) for row in rows])
    table[f"vs {RANKER_REFERENCE}"] = versus(rows, RANKER_REFERENCE)
    claims = supported(root / "claims.yaml", "rankers", keyed("rankers", ((r.key, r.records) for r in rows)))
    table = table.sort_values(["model", "dataset", "variant"], kind="stable")
    section.table = shown(table.set_index(["model", "dataset", "variant"]).dropna(axis=1, how="all")).round(2)
    last = f"acc@{max(int(c[4:]) for c in table.columns if c.startswith('acc@'))}"
    figure = figures / "rankers.png"
    accuracy_against_time(table[table.dataset == "synthetic"], last, figure)
    section.figure = str(figure.relative_to(root))
    section.after = (f"{POOLED_INTERVALS} `vs {RANKER_REFERENCE}`: {PAIRED}\n\n"
                     f"Figure: accuracy at the last step ({last}) on the synthetic set against seconds per question "
                     "(ranking, selection, prefill, decode), one point per variant, with its interval. Threads: "
                     + ", ".join(sorted({str(r.config.get('threads')) for r in chosen})) + "."
                     + claims)
    return section


def peer_row(row: Row) -> dict:
    """Accuracy (%) per step; at the last step, the time to first token (every phase before decoding) and the
    memory tokens stored; seconds per question over all steps."""
    frame = row.records
    seconds = pd.DataFrame(list(frame["seconds"]), index=frame.index)
    asked = seconds.drop(columns=[c for c in UPDATE_PHASES if c in seconds])     # the question's own phases
    last = frame[frame["step"] == frame["step"].max()]
    to_first_token = asked.drop(columns="decode").sum(axis=1)
    return row.cells(frame, "method", **{f"ttft s@{last['step'].max()}": to_first_token[last.index].mean(),
                                         "s/question": asked.sum(axis=1).mean(),
                                         "memory tokens stored": last["memory_tokens"].mean()})


PEERS = Path(__file__).resolve().parents[2] / "conf" / "experiment" / "peers.yaml"      # its methods' order


def peers_section(root, runs, figures) -> Section:
    """`tab:peers`: MemDefrag against the other training-free fixes (APE, EPIC, CacheBlend), full prefill and the
    floors on the same memory, from experiment=peers; the figure of accuracy against time to first token; and
    memdefrag-bench's time to first token at the paper's N_max (results/peers/speed_*.md)."""
    section = Section("tab:peers", "The other training-free fixes on the same memory: accuracy (%) at n updates, "
                      "time to first token at the last step, seconds per question")
    chosen = [r for r in runs if r.study == "peers"]         # rows in experiment=peers' order of methods
    speed = sorted((root / "peers").glob("speed*.md"))
    section.after = "\n\n".join(bench_table(f, root) for f in speed)
    if not chosen:
        section.missing = "no runs yet: memdefrag experiment=peers"
        return section
    order = {label: i for i, label in enumerate(OmegaConf.load(PEERS).hydra.sweeper.params.method.split(","))}
    rows = rows_of(chosen, labelled(chosen, "tab:peers", leave=("seed",)))
    table = pd.DataFrame([peer_row(row) for row in rows])
    table[f"vs {PEER_REFERENCE}"] = versus(rows, PEER_REFERENCE)
    claims = supported(root / "claims.yaml", "peers", keyed("peers", ((r.key, r.records) for r in rows)))
    table["option"] = table["method"].str.split().str[0].map(order).fillna(len(order))   # the sweep's option
    table = table.sort_values(["model", "dataset", "option", "method"]).drop(columns="option")   # a label begins with
    section.table = shown(table.set_index(["model", "dataset", "method"])).round(2)
    last = f"acc@{max(int(c[4:]) for c in table.columns if c.startswith('acc@'))}"
    ttft = next(c for c in table.columns if c.startswith("ttft"))
    figure = figures / "peers.png"
    accuracy_against_time(table[table.dataset == "synthetic"], last, figure, time=ttft, name="method")
    section.figure = str(figure.relative_to(root))
    section.after = (f"{POOLED_INTERVALS} `vs {PEER_REFERENCE}`: {PAIRED}\n\n"
                     f"Figure: accuracy at the last step ({last}) on the synthetic set against the time to first "
                     f"token there, one point per method, with its interval. Threads: "
                     + ", ".join(sorted({str(r.config.get("threads")) for r in chosen})) + "." + claims + "\n\n"
                     + section.after)
    return section

