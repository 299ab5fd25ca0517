"""What a sweep reports: sweep.json, sweep.csv, sweep.png and a table per group."""

import csv
import dataclasses
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

from gorila_jax import plots
from launch import stats
from launch.sweep_runs import CONSOLE_LOG, Run


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def _estimate_cells(estimates: dict[str, Any] | None, digits: int) -> list[str]:
    if estimates is None:
        return ["-"] * 3
    return [
        f"{_fmt(e['estimate'], digits)} [{_fmt(e['ci_low'], digits)}, {_fmt(e['ci_high'], digits)}]"
        for e in (estimates[name] for name in stats.AGGREGATES)
    ]


def group_table(group: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """A group's statistics as a header and rows: one row per quantity."""
    header = ["", *(f"{aggregate} [95% CI]" for aggregate in stats.AGGREGATES)]
    rows = [["final greedy return", *_estimate_cells(group["final_return"], 1)]]
    if "threshold" in group:
        rows.append(
            [f"env steps to {group['threshold']:g} (reached runs)"]
            + _estimate_cells(group["env_steps_to_threshold_over_reached"], 0)
        )
        rows.append(
            [f"wall s to {group['threshold']:g} (reached runs)"]
            + _estimate_cells(group["wall_time_s_to_threshold_over_reached"], 1)
        )
    return header, rows


def _group_title(name: str, group: dict[str, Any]) -> str:
    title = f"{name}: {group['num_finished']}/{group['num_runs']} runs finished"
    if "threshold" in group:
        fraction = group["fraction_at_threshold"]
        title += (
            f", final return >= {group['threshold']:g} in "
            f"{'-' if fraction is None else f'{fraction:.0%}'} of them, "
            f"{group['num_reached']} reached it during training"
        )
    return title


def print_tables(group_stats: dict[str, dict[str, Any]], out=sys.stdout) -> None:
    """One table per group: a rich table on a terminal, plain columns otherwise."""
    for name, group in group_stats.items():
        header, rows = group_table(group)
        if out.isatty():
            import rich.console
            import rich.table

            table = rich.table.Table(*header, title=_group_title(name, group))
            for row in rows:
                table.add_row(*row)
            rich.console.Console(file=out).print(table)
            continue
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        print(_group_title(name, group), file=out)
        for row in [header, *rows]:
            print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)), file=out)


def _csv_row(run: Run, grid_point: dict[str, str]) -> dict[str, Any]:
    crossing = run.threshold or {}
    return {
        "group": run.group,
        **grid_point,
        "seed": run.seed,
        "status": run.status,
        "returncode": run.returncode,
        "final_return": run.final_return,
        "wall_time_s": run.wall_time_s,
        "env_steps": run.env_steps,
        "reached_threshold": crossing.get("reached"),
        "env_steps_to_threshold": crossing.get("env_steps"),
        "wall_time_s_to_threshold": crossing.get("wall_time_s"),
        "logdir": run.logdir,
    }


def write_figure(sweep_dir: str, runs: Sequence[Run], threshold: float | None) -> None:
    """sweep.png: each group's final greedy returns (the groups with any)."""
    finals: dict[str, list[float]] = {}
    for run in runs:
        if run.final_return is not None:
            finals.setdefault(run.group, []).append(run.final_return)
    if finals:
        plots.write_sweep_figure(finals, os.path.join(sweep_dir, "sweep.png"), threshold)


def write_results(
    sweep_dir: str,
    record: dict[str, Any],
    runs: Sequence[Run],
    grid_points: dict[str, dict[str, str]],
) -> None:
    """sweep.json (the command, every run, the statistics) and sweep.csv (a row per run)."""
    record = {**record, "runs": [dataclasses.asdict(run) for run in runs]}
    with open(os.path.join(sweep_dir, "sweep.json"), "w") as f:
        json.dump(record, f, indent=2)
    rows = [_csv_row(run, grid_points[run.group]) for run in runs]
    with open(os.path.join(sweep_dir, "sweep.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def report_end(run: Run, out=sys.stdout) -> None:
    if run.status == "finished":
        print(
            f"[{run.group} seed={run.seed}] finished: final greedy return "
            f"{_fmt(run.final_return)} in {_fmt(run.wall_time_s)}s",
            file=out,
            flush=True,
        )
        return
    print(
        f"[{run.group} seed={run.seed}] {run.status} with exit code {run.returncode}; "
        f"last lines of {os.path.join(run.logdir, CONSOLE_LOG)}:",
        file=out,
        flush=True,
    )
    for line in run.console_tail:
        print(f"    {line}", file=out, flush=True)
