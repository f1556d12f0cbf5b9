"""The `cleaner` command line: parse, call, print."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cleaner.config import ConfigError, recipe_path
from cleaner.engines.base import EngineUnavailable
from cleaner.jsonl import RecordError


def _quiet_libraries() -> None:
    """transformers' per-file progress bars would drown the run's own lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


app = typer.Typer(
    callback=_quiet_libraries,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Agentic RL for tool-using language models with CLEANER's self-purified trajectories.",
)
sandbox_app = typer.Typer(no_args_is_help=True, help="The interpreter sandbox as a service.")
app.add_typer(sandbox_app, name="sandbox")
err = Console(stderr=True)
out = Console()


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def summary_table(title: str, rows: list[tuple[str, object]]) -> Table:
    table = Table(title=title, show_header=False)
    for name, value in rows:
        table.add_row(name, f"{value:.3g}" if isinstance(value, float) else str(value))
    return table


def progress_bar(total: int, what: str):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn(f"[bold]{what}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        disable=not err.is_terminal,
        transient=False,
    )


# --- purify -----------------------------------------------------------------------------------------


@app.command()
def purify(
    input: Annotated[Path, typer.Argument(help="raw trajectories, JSONL (cleaner.trajectory/1)")],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="where to write purified trajectories")
    ],
    gamma: Annotated[
        float, typer.Option(help="similarity threshold: >= gamma shallow graft, below deep")
    ] = 0.5,
    max_retries: Annotated[
        int, typer.Option(help="correction attempts per failed call before giving up")
    ] = 3,
    similarity_on: Annotated[
        str, typer.Option(help="compare 'code' strings or rendered tool 'call' text")
    ] = "code",
) -> None:
    """Apply SAAR offline: graft each successful correction in place of the failed call before it."""
    from cleaner.purify import purify_file

    if similarity_on not in ("code", "call"):
        raise fail(f"--similarity-on must be 'code' or 'call', got {similarity_on!r}")
    if gamma < 0 or max_retries < 0:
        raise fail("--gamma and --max-retries must be >= 0")
    if not input.is_file():
        raise fail(f"{input}: no such file")
    try:
        s = purify_file(
            input, output, gamma=gamma, max_retries=max_retries, similarity_on=similarity_on
        )
    except RecordError as e:
        raise fail(str(e), code=1) from None
    out.print(
        summary_table(
            f"purified {input} -> {output}",
            [
                ("trajectories", s.trajectories),
                ("failed calls", s.failed_calls),
                ("recovered", s.recovered),
                ("shallow grafts", s.shallow),
                ("deep grafts", s.deep),
                ("gave up", s.gave_up),
                ("failed calls left", s.failed_calls_after),
            ],
        )
    )


# --- config -----------------------------------------------------------------------------------------


@app.command()
def config(
    config_file: Annotated[
        Path | None, typer.Option("--config", help="YAML config to resolve")
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides: saar.gamma=0.7")
    ] = None,
) -> None:
    """Print every option with its value and one-line help (after applying a config and overrides)."""
    from cleaner.config import describe, load_config, to_dict

    try:
        resolved = load_config(config_file, overrides or [])
    except ConfigError as e:
        raise fail(str(e)) from None
    flat: dict[str, object] = {}

    def walk(d, prefix=""):
        for k, v in d.items():
            walk(v, f"{prefix}{k}.") if isinstance(v, dict) else flat.__setitem__(f"{prefix}{k}", v)

    walk(to_dict(resolved))
    table = Table("option", "value", "help")
    for name, _default, help_text in describe():
        table.add_row(name, repr(flat[name]), help_text)
    out.print(table)


# --- train ------------------------------------------------------------------------------------------


@app.command()
def train(
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides: saar.gamma=0.7 train.steps=50")
    ] = None,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="YAML recipe; default: the embedded tiny run")
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="where the run lives; default runs/<time>")
    ] = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="continue the run in this directory")
    ] = None,
) -> None:
    """Train with CLEANER (GRPO/DAPO on SAAR-purified trajectories). With no arguments: bootstrap
    the embedded tiny model if needed, train it on reasoning-gym tasks on CPU, and evaluate it."""
    from cleaner.config import load_config
    from cleaner.train import trainer
    from cleaner.train.report import plot, write_report

    started = time.time()
    display = _TrainDisplay()
    try:
        if resume is not None:
            if config_file or overrides:
                raise fail(
                    "--resume continues a run with its own config; drop --config and overrides"
                )
            directory = resume
            display.total = (
                load_config(resume / "config.yaml").train.steps
                if (resume / "config.yaml").is_file()
                else 0
            )
            last = trainer.resume(resume, log=display.log, on_step=display.step)
        else:
            cfg = load_config(recipe_path(config_file or Path("tiny")), overrides or [])
            directory = run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
            display.total = cfg.train.steps
            err.print(f"run directory: {directory}")
            last = trainer.start(cfg, directory, log=display.log, on_step=display.step)
    except (ConfigError, RecordError, FileNotFoundError) as e:
        raise fail(str(e)) from None
    plot(directory)
    report = write_report(directory)
    rows = [
        (k, v)
        for k, v in last.items()
        if k.split("/")[0] in ("eval", "reward", "tool", "saar")
        and not k.startswith("tool/failures/")
    ]
    out.print(summary_table(f"{directory} after {time.time() - started:.0f} s", rows))
    out.print(f"report: {report}")


class _TrainDisplay:
    """A line per step: step, reward, accuracy, tool failures per trajectory, time left."""

    def __init__(self):
        self.total = 0
        self.started = time.time()
        self.first_step: int | None = None  # a resumed run starts counting where it resumed

    def log(self, message: str) -> None:
        err.print(message, highlight=False)

    def step(self, step: int, m: dict) -> None:
        if step == 0:  # the evaluation before training
            err.print(
                f"before training: eval acc {m['eval/accuracy']:.2f}  "
                f"tool failures/traj {m['eval/failures_per_traj']:.2f}",
                highlight=False,
            )
            self.started = time.time()
            return
        if self.first_step is None:
            self.first_step = step - 1
        done = step - self.first_step
        left = (time.time() - self.started) / done * (self.total - step) if self.total else 0
        evals = f"  eval acc {m['eval/accuracy']:.2f}" if "eval/accuracy" in m else ""
        err.print(
            f"step {step}/{self.total or '?'}  reward {m['reward/mean']:+.2f}  acc {m['reward/accuracy']:.2f}  "
            f"tool failures/traj {m['tool/failures_per_traj']:.2f}  recovered {m['saar/recovered']:.2f}"
            f"{evals}  {m['time/step']:.0f} s/step  ~{left / 60:.1f} min left",
            highlight=False,
        )


@app.command()
def compare(
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides for every run: train.steps=20")
    ] = None,
    config_file: Annotated[
        Path | None, typer.Option("--config", help="recipe; default: the embedded tiny run")
    ] = None,
    output: Annotated[
        Path,
        typer.Option("-o", "--output", help="folder for the runs, compare.json and compare.png"),
    ] = Path("runs/compare"),
    seeds: Annotated[int, typer.Option(help="seeds per variant")] = 3,
) -> None:
    """CLEANER vs the same run without SAAR vs SFT on purified trajectories, several seeds each."""
    from cleaner.train.compare import run_all

    try:
        summary = run_all(
            recipe_path(config_file or Path("tiny")),
            output,
            list(range(seeds)),
            overrides or [],
            log=lambda m: err.print(m, highlight=False),
        )
    except (ConfigError, RecordError, FileNotFoundError) as e:
        raise fail(str(e)) from None
    table = Table(
        "variant",
        f"final {summary['accuracy_metric']}",
        f"final {summary['failures_metric']}",
        "steps to baseline's final accuracy",
        title=f"{output} ({seeds} seeds, mean ± sd)",
    )
    for name, row in summary["table"].items():
        (acc, acc_sd), (fail_mean, fail_sd) = row["final_accuracy"], row["final_tool_failures"]
        reach = ", ".join("-" if r is None else str(r) for r in row["steps_to_baseline_final"])
        table.add_row(name, f"{acc:.3f} ± {acc_sd:.3f}", f"{fail_mean:.3f} ± {fail_sd:.3f}", reach)
    out.print(table)
    out.print(f"figure: {output / 'compare.png'}; numbers: {output / 'compare.json'}")


# --- bootstrap, rollout, eval -----------------------------------------------------------------------


@app.command()
def bootstrap(
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", help="model directory; default: the per-machine cache"),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of traces, tokenizer and model")] = 0,
    n_traces: Annotated[int | None, typer.Option(help="synthetic traces to train on")] = None,
    failure_rate: Annotated[
        float | None, typer.Option(help="fraction of traces whose first call fails")
    ] = None,
    force: Annotated[bool, typer.Option(help="rebuild even if it exists")] = False,
    check: Annotated[
        int, typer.Option(help="sample this many held-out problems afterwards and report")
    ] = 0,
) -> None:
    """Build the embedded tiny model: tokenizer, Qwen3-architecture model, SFT on tool-use traces."""
    from cleaner.tiny.bootstrap import bootstrap_command

    path = bootstrap_command(
        output,
        seed=seed,
        n_traces=n_traces,
        failure_rate=failure_rate,
        force=force,
        check=check,
        log=lambda m: err.print(m, highlight=False),
    )
    out.print(str(path))


def _resolve_model(model: str) -> Path:
    if model == "tiny":
        from cleaner.tiny.bootstrap import default_model_dir

        return default_model_dir(log=lambda m: err.print(m, highlight=False))
    return Path(model)


def _load_problems(data: str, root: Path | None, size: int, seed: int):
    from cleaner.data import TOOL_TASKS, load_benchmark

    name = "gym:" + ",".join(TOOL_TASKS) if data == "gym" else data
    return load_benchmark(name, root=root, size=size, seed=seed)


def _rollout_and_grade(
    model: str,
    problems,
    n: int,
    saar: bool,
    overrides: list[str],
    what: str,
    temperature: float | None = None,
    top_p: float | None = None,
):
    """Load the model, roll out `n` samples a problem with the embedded engine and sandbox, grade."""
    import asyncio
    import dataclasses

    import torch

    from cleaner.agent import Rollout
    from cleaner.collect import collect, grade_groups
    from cleaner.config import load_config
    from cleaner.engines.hf import HFEngine, load_policy, load_tokenizer
    from cleaner.engines.remote import OpenAIEngine
    from cleaner.rewards.math import MathVerifier
    from cleaner.sandbox import Limits, connect

    cfg = load_config(None, overrides)
    rollout_cfg = dataclasses.replace(
        cfg.rollout,
        **({"temperature": temperature} if temperature is not None else {}),
        **({"top_p": top_p} if top_p is not None else {}),
    )
    saar_cfg = dataclasses.replace(cfg.saar, enabled=saar)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.rollout.engine_url:  # sample from a server; the model directory gives the tokenizer
        tokenizer = load_tokenizer(_resolve_model(model))
    else:
        policy, tokenizer = load_policy(_resolve_model(model), device)

    async def main():
        if cfg.rollout.engine_url:
            engine = OpenAIEngine(cfg.rollout.engine_url)
        else:
            engine = HFEngine(policy, tokenizer, max_batch_size=cfg.train.max_batch_size)
        limits = Limits(timeout=rollout_cfg.tool_timeout, memory_mb=cfg.sandbox.memory_mb)
        with progress_bar(len(problems) * n, what) as bar:
            task = bar.add_task(what, total=len(problems) * n)
            async with connect(
                cfg.sandbox.url,
                workers=cfg.sandbox.workers or None,
                isolation=cfg.sandbox.isolation,
                preload=tuple(cfg.sandbox.preload),
                limits=limits,
            ) as sb:
                rollout = Rollout(engine, sb, tokenizer, rollout_cfg, saar_cfg)
                try:
                    groups = await collect(
                        rollout, problems, n, cfg.seed, what, on_done=lambda t: bar.advance(task)
                    )
                finally:
                    if isinstance(engine, OpenAIEngine):
                        await engine.aclose()
                with MathVerifier() as verifier:
                    return groups, await grade_groups(problems, groups, verifier, sb)

    return asyncio.run(main())


def _write_trajectories(groups, path: Path, with_tokens: bool) -> None:
    from cleaner.jsonl import atomic_writer, dump_line

    with atomic_writer(path) as f:
        for group in groups:
            for t in group:
                f.write(dump_line(t.to_dict() if with_tokens else t.trajectory.to_dict()))


def _summary_rows(s) -> list[tuple[str, object]]:
    return [
        ("trajectories", s.trajectories),
        ("accuracy (avg@k, 95% CI)", str(s.accuracy)),
        (f"pass@{s.k}", str(s.pass_at_k)),
        ("tool calls / trajectory", s.tool_calls),
        ("tool failures / trajectory (first attempts)", s.tool_failures),
        ("SAAR recovered", s.saar_recovered),
        ("SAAR gave up", s.saar_gave_up),
        ("shallow grafts", s.shallow),
        ("deep grafts", s.deep),
    ]


@app.command()
def rollout(
    output: Annotated[Path, typer.Option("-o", "--output", help="trajectories, JSONL")],
    model: Annotated[
        str, typer.Option(help="model directory, or 'tiny' for the embedded model")
    ] = "tiny",
    data: Annotated[
        str, typer.Option(help="'gym', gym:TASK[,TASK], a benchmark name or a problems .jsonl")
    ] = "gym",
    root: Annotated[Path | None, typer.Option(help="folder of local benchmark files")] = None,
    size: Annotated[int, typer.Option(help="problems per gym task")] = 8,
    n: Annotated[int, typer.Option("--n", help="samples per problem")] = 8,
    saar: Annotated[
        bool, typer.Option("--saar/--no-saar", help="online SAAR during rollout")
    ] = True,
    tokens: Annotated[bool, typer.Option(help="also write token ids, masks and log-probs")] = False,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted config overrides: rollout.max_turns=8")
    ] = None,
) -> None:
    """Roll out problems with a model, the sandboxed interpreter and (by default) online SAAR."""
    from cleaner.collect import summarize

    try:
        problems = _load_problems(data, root, size, seed=1)
        groups, verdicts = _rollout_and_grade(model, problems, n, saar, overrides or [], "rollout")
    except (ConfigError, RecordError, FileNotFoundError, ValueError, EngineUnavailable) as e:
        raise fail(str(e)) from None
    _write_trajectories(groups, output, tokens)
    out.print(
        summary_table(f"{model} on {data} -> {output}", _summary_rows(summarize(groups, verdicts)))
    )


@app.command("eval")
def evaluate(
    model: Annotated[
        str, typer.Option(help="model directory, or 'tiny' for the embedded model")
    ] = "tiny",
    data: Annotated[
        list[str] | None,
        typer.Option(
            help="benchmarks: aime2024, aime2025, gpqa-diamond, gym:TASK, a .jsonl; repeatable"
        ),
    ] = None,
    root: Annotated[
        Path | None, typer.Option(help="the Open-AgentRL-Eval folder for the paper's benchmarks")
    ] = None,
    samples: Annotated[int, typer.Option(help="samples per problem (k)")] = 16,
    saar: Annotated[
        bool, typer.Option("--saar/--no-saar", help="online SAAR at evaluation")
    ] = False,
    temperature: Annotated[float, typer.Option(help="reference protocol: 1.0")] = 1.0,
    top_p: Annotated[float, typer.Option(help="reference protocol: 0.6")] = 0.6,
    size: Annotated[int, typer.Option(help="problems per gym task")] = 16,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="folder for results.json and trajectories")
    ] = Path("eval"),
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted config overrides")] = None,
) -> None:
    """avg@k and pass@k with 95% intervals per benchmark, tool use, and the trajectories saved."""
    from cleaner.collect import summarize

    results = {}
    table = Table(
        "benchmark",
        "avg@k [95% CI]",
        "pass@k",
        "tool calls",
        "tool failures",
        title=f"{model}, k={samples}",
    )
    for name in data or ["gym"]:
        try:
            problems = _load_problems(name, root, size, seed=10_000)
            groups, verdicts = _rollout_and_grade(
                model, problems, samples, saar, overrides or [], name, temperature, top_p
            )
        except (
            ConfigError,
            RecordError,
            FileNotFoundError,
            ValueError,
            EngineUnavailable,
        ) as e:
            raise fail(f"{name}: {e}") from None
        s = summarize(groups, verdicts)
        results[name] = s.to_dict()
        safe = name.replace(":", "_").replace(",", "_").replace("/", "_")
        _write_trajectories(groups, output / f"{safe}.jsonl", with_tokens=False)
        table.add_row(
            name, str(s.accuracy), str(s.pass_at_k), f"{s.tool_calls:.2f}", f"{s.tool_failures:.2f}"
        )
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(
        json.dumps(
            {
                "model": model,
                "samples": samples,
                "saar": saar,
                "temperature": temperature,
                "top_p": top_p,
                "benchmarks": results,
            },
            indent=2,
        )
    )
    out.print(table)
    out.print(f"results: {output / 'results.json'}")


@app.command("to-verl")
def to_verl(
    output: Annotated[Path, typer.Option("-o", "--output", help="a parquet file for verl")],
    data: Annotated[
        str, typer.Option(help="'gym', gym:TASK[,TASK], a benchmark name or a problems .jsonl")
    ] = "gym",
    root: Annotated[Path | None, typer.Option(help="folder of local benchmark files")] = None,
    size: Annotated[int, typer.Option(help="problems per gym task")] = 64,
    split: Annotated[
        str,
        typer.Option(help="extra_info.split; rows not of 'train' run without SAAR (validation)"),
    ] = "train",
) -> None:
    """Write problems as verl dataset rows that run the `cleaner_agent` loop (CLEANER in verl)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cleaner.integrations.verl.convert import to_verl_rows

    try:
        problems = _load_problems(data, root, size, seed=1 if split == "train" else 10_000)
    except (RecordError, FileNotFoundError, ValueError) as e:
        raise fail(str(e)) from None
    output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(to_verl_rows(problems, split)), output)
    out.print(f"{len(problems)} problems -> {output} (agent_name cleaner_agent)")


# --- score, exec, sandbox serve ---------------------------------------------------------------------


@app.command()
def score(
    input: Annotated[
        Path, typer.Argument(help='JSONL lines {"id", "response", "answer"} ("tests" for code)')
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="scored JSONL")],
    kind: Annotated[
        str, typer.Option(help="math, mcq, or code (tests run in the sandbox)")
    ] = "math",
) -> None:
    """Grade responses: adds `correct` and `score` (and `reward`, `predicted`) to every line."""
    from cleaner.rewards import score_file

    if kind not in ("math", "mcq", "code"):
        raise fail(f"--kind must be math, mcq or code, got {kind!r}")
    if not input.is_file():
        raise fail(f"{input}: no such file")
    try:
        s = score_file(input, output, kind)
    except RecordError as e:
        raise fail(str(e), code=1) from None
    out.print(summary_table(f"scored {input} -> {output}", list(s.items())))


@app.command("exec")
def exec_(
    input: Annotated[Path, typer.Argument(help='JSONL lines {"id", "code", "session"?, "stdin"?}')],
    output: Annotated[Path, typer.Option("-o", "--output", help="results, one line per input id")],
    timeout: Annotated[float, typer.Option(help="seconds per call")] = 10.0,
    memory_mb: Annotated[int, typer.Option(help="address-space limit per call, MiB")] = 2048,
    workers: Annotated[
        int | None, typer.Option(help="sandbox workers; default one per core")
    ] = None,
    isolation: Annotated[str, typer.Option(help="auto, namespaces or none")] = "auto",
    url: Annotated[
        str | None, typer.Option(help="use a `cleaner sandbox serve` service instead")
    ] = None,
) -> None:
    """Run untrusted Python in the sandbox; lines of one session run in order in one interpreter."""
    from cleaner.sandbox import IsolationUnavailable, exec_file

    if not input.is_file():
        raise fail(f"{input}: no such file")
    try:
        s = exec_file(
            input,
            output,
            timeout=timeout,
            memory_mb=memory_mb,
            workers=workers,
            isolation=isolation,
            progress=err.is_terminal,
            url=url,
        )
    except IsolationUnavailable as e:
        raise fail(str(e)) from None
    except RecordError as e:
        raise fail(str(e), code=1) from None
    out.print(summary_table(f"{input} -> {output}", list(s.items())))


@app.command()
def serve(
    model: Annotated[
        str, typer.Argument(help="a transformers model directory, or 'tiny' for the embedded model")
    ] = "tiny",
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8000,
    max_batch_size: Annotated[int, typer.Option(help="sequences decoded together")] = 64,
) -> None:
    """Serve a model over the OpenAI completions API, as vLLM does; point rollout.engine_url at it."""
    from cleaner.engines.server import serve as serve_completions

    try:
        serve_completions(str(_resolve_model(model)), host, port, max_batch_size)
    except (FileNotFoundError, ValueError, OSError) as e:
        raise fail(str(e)) from None


@sandbox_app.command("serve")
def sandbox_serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8470,
    workers: Annotated[
        int | None, typer.Option(help="sandbox workers; default one per core")
    ] = None,
    timeout: Annotated[float, typer.Option(help="default seconds per call")] = 10.0,
    memory_mb: Annotated[int, typer.Option(help="address-space limit per call, MiB")] = 2048,
    isolation: Annotated[str, typer.Option(help="auto, namespaces or none")] = "auto",
) -> None:
    """Serve the sandbox over HTTP; rollouts use it when sandbox.url (or CLEANER_SANDBOX_URL) is set."""
    from cleaner.sandbox import serve

    serve(host, port, workers=workers, timeout=timeout, memory_mb=memory_mb, isolation=isolation)


if __name__ == "__main__":
    sys.exit(app())
