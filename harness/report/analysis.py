"""Figures and tables of the analysis tasks, from a run folder's files.

`python -m harness.report.analysis RUN_DIR...`: for a probe run, tracing.md (the per-layer table,
best first); for a distortion run, per query mode, the density heatmap, accuracy and density
at the best-correlated layer, and the correlation bars (PNG), plus correlations.md.
"""

from __future__ import annotations

from pathlib import Path

from evals.distortion import accuracy_by_step, correlations, density_by_step
from evals.probe import tracing_table
from harness.errors import OneLineParser
from harness.results.figures import accuracy_and_density, correlation_bars, density_heatmap
from harness.plugins.contracts import declared_tables
from harness.results.folder import finished, read_config
from harness.report.sections import with_bounds
from methods.attention.tracing import QueryMode


def write_analysis(folder: str | Path, records: list[dict]) -> list[Path]:
    """The figures and tables of one run folder from its records (the caller has read them);
    returns what was written."""
    folder = Path(folder)
    target = read_config(folder).task._target_
    tables = declared_tables(target)
    if "tab:retrieval_layers" in tables:
        out = folder / "tracing.md"
        out.write_text(with_bounds(tracing_table(records)).to_markdown(index=False, floatfmt=".2f") + "\n")
        return [out]
    if "fig:distortion" not in tables:
        raise ValueError(f"{folder} is a {target} run; analysis figures exist for probe and distortion runs")
    table = correlations(records)
    written = [folder / "correlations.md"]
    written[0].write_text(table.to_markdown(index=False, floatfmt=".3f") + "\n")
    accuracy = accuracy_by_step(records)
    for mode in QueryMode:
        density = density_by_step(records, mode)
        rows = table[table.query_mode == mode]
        best = int(rows.iloc[0]["layer"])
        paths = [folder / f"density_heatmap_{mode}.png", folder / f"accuracy_density_{mode}.png",
                 folder / f"correlations_{mode}.png"]
        density_heatmap(density, paths[0], f"target density ({mode} prompt tokens)")
        accuracy_and_density(accuracy, density[best], paths[1], f"layer {best} ({mode})")
        correlation_bars(rows, paths[2], f"density vs accuracy per layer ({mode})")
        written += paths
    return written


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+")
    for folder in parser.parse_args(argv).folders:
        for path in write_analysis(folder, finished(Path(folder)).records):
            print(path)


if __name__ == "__main__":
    main()
