"""The `cleaner` command line: parse, call, print."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cleaner.config import ConfigError
from cleaner.jsonl import RecordError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Agentic RL for tool-using language models with CLEANER's self-purified trajectories.",
)
console = Console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


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
    table = Table(title=f"purified {input} -> {output}", show_header=False)
    for name, value in [
        ("trajectories", s.trajectories),
        ("failed calls", s.failed_calls),
        ("recovered", s.recovered),
        ("shallow grafts", s.shallow),
        ("deep grafts", s.deep),
        ("gave up", s.gave_up),
        ("failed calls left", s.failed_calls_after),
    ]:
        table.add_row(name, str(value))
    Console().print(table)


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
    Console().print(table)


@app.command()
def train(
    config_file: Annotated[
        Path | None, typer.Option("--config", help="YAML recipe; default: the embedded tiny run")
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides: saar.gamma=0.7")
    ] = None,
) -> None:
    """Train with CLEANER (GRPO/DAPO on SAAR-purified trajectories). Default: the embedded tiny model on CPU."""
    from cleaner.config import load_config

    try:
        load_config(config_file, overrides or [])
    except ConfigError as e:
        raise fail(str(e)) from None
    raise fail("the trainer has not landed yet (issue 5); the configuration above is valid", code=3)


if __name__ == "__main__":
    app()
